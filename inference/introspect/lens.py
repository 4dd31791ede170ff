"""Inside the layers for one token of a sequence: its embedding, the logit lens and the
attention of each head of one layer.

Owns: one batch-1 forward pass of the served transformers model with every hidden state
(and, for attention, transformers' eager attention, the only implementation that returns the
weights: switched on for this pass and restored after, on the thread that owns the model),
and the read-outs. The lens applies the model's final norm and LM head to each layer's
output, as the model does to its last one; the last row is the model's own output
distribution. Must not know: requests, sampling, Django.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch


def final_norm(model) -> torch.nn.Module:
    """The norm the model applies before its LM head (Llama/Qwen2/Mistral/DeepSeek: `model.norm`,
    GPT-2: `transformer.ln_f`)."""
    decoder = model.get_decoder()
    for name in ("norm", "ln_f", "final_layer_norm"):
        if isinstance(getattr(decoder, name, None), torch.nn.Module):
            return getattr(decoder, name)
    raise ValueError(f"no final norm found on {type(model).__name__}: the logit lens needs one")


@contextmanager
def eager_attention(model):
    """transformers returns attention weights only from its eager implementation."""
    before = model.config._attn_implementation
    if before == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


@torch.inference_mode()
def inspect_position(
    model, token_ids: list[int], position: int, layer: int | None = None, top_n: int = 5
) -> dict[str, Any]:
    """Logit lens and (when `layer` is given) the attention of each head of `layer` for the
    token at `position` of `token_ids` (it predicts token `position + 1`)."""
    if not 0 <= position < len(token_ids):
        raise ValueError(f"position {position} is outside the sequence (0..{len(token_ids) - 1})")
    num_layers = model.config.num_hidden_layers
    if layer is not None and not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} does not exist (0..{num_layers - 1})")
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids[: position + 1]], device=device)
    want_attention = layer is not None
    if want_attention:
        with eager_attention(model):
            out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    else:
        out = model(input_ids=ids, output_hidden_states=True)
    result: dict[str, Any] = {
        "position": position,
        "token_id": token_ids[position],
        "lens": logit_lens(model, out, top_n),
    }
    if want_attention:
        weights = out.attentions[layer][0, :, -1, :].float()  # (heads, position + 1)
        result["attention"] = {"layer": layer, "weights": weights.tolist()}
    return result


def logit_lens(model, out, top_n: int) -> list[dict[str, Any]]:
    """One row per hidden state: the embedding output, then after each layer. The last
    hidden state transformers returns already went through the final norm: its row is the
    model's own logits, the others go through the final norm and the LM head here."""
    norm, head = final_norm(model), model.get_output_embeddings()
    hidden_states = out.hidden_states
    rows = []
    for i, hidden in enumerate(hidden_states):
        is_last = i == len(hidden_states) - 1
        logits = out.logits[0, -1] if is_last else head(norm(hidden[0, -1:]))[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        values, ids = torch.topk(logprobs, top_n)
        rows.append(
            {
                "layer": i,  # 0: the embedding itself; i: after layer i (1-based)
                "top": [{"token_id": int(t), "prob": math.exp(float(v))} for v, t in zip(values, ids)],
                "entropy": float(-(logprobs.exp() * logprobs).nan_to_num().sum()),
            }
        )
    return rows


@torch.inference_mode()
def embedding_of(model, token_id: int, top_n: int = 8) -> dict[str, Any]:
    """A token's row of the input embedding table: its size, its norm (and the table's mean
    for scale) and the tokens whose rows point the most the same way (cosine)."""
    table = model.get_input_embeddings().weight
    if not 0 <= token_id < table.shape[0]:
        raise ValueError(f"token id {token_id} is outside the embedding table (0..{table.shape[0] - 1})")
    table = table.float()
    vector = table[token_id]
    norms = table.norm(dim=-1)
    cosine = (table @ vector) / (norms * vector.norm()).clamp_min(1e-12)
    cosine[token_id] = -math.inf  # itself is trivially the nearest
    values, ids = torch.topk(cosine, top_n)
    return {
        "token_id": token_id,
        "size": int(vector.numel()),
        "norm": float(vector.norm()),
        "mean_norm": float(norms.mean()),
        "head": [round(float(x), 4) for x in vector[:16]],
        "nearest": [{"token_id": int(t), "cosine": float(v)} for v, t in zip(values, ids)],
    }
