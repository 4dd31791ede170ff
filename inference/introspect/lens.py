"""Inside the layers for one token of a sequence: its embedding, the logit lens and the
attention of each head of one layer.

Owns: the lens's read-out of the served pass's per-layer logits (`InspectionPasses.read_layers`: the
model's final norm and LM head applied after each layer, as the model does to its last one, on
the served runner and kernels, so the last row is the streamed distribution itself), and the
attention weights, from one batch-1 transformers pass in eager attention (the only
implementation that returns them: switched on for this pass and restored after, on the thread
that owns the model). Must not know: requests, sampling, Django.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch


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


def lens_rows(layer_logits: torch.Tensor, top_n: int) -> list[dict[str, Any]]:
    """The logit lens's rows from `layer_logits` (L + 1, vocab): one per read-out, the embedding
    first, then after each layer; the last is the model's own distribution."""
    logprobs = torch.log_softmax(layer_logits.float(), dim=-1)  # (L + 1, vocab)
    values, ids = torch.topk(logprobs, top_n, dim=-1)
    entropies = -(logprobs.exp() * logprobs).nan_to_num().sum(dim=-1)  # (L + 1,)
    return [
        {
            "layer": i,  # 0: the embedding itself; i: after layer i (1-based)
            "top": [{"token_id": int(t), "prob": math.exp(float(v))} for v, t in zip(values[i], ids[i])],
            "entropy": float(entropies[i]),
        }
        for i in range(logprobs.shape[0])
    ]


@torch.inference_mode()
def attention_of(model, token_ids: list[int], layer: int) -> list[list[float]]:
    """The attention weights of each head of `layer` for the last of `token_ids`, (heads, T):
    one batch-1 transformers pass in eager attention (the served kernels never form the weights)."""
    num_layers = model.config.get_text_config().num_hidden_layers
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} does not exist (0..{num_layers - 1})")
    device = next(model.parameters()).device
    with eager_attention(model):
        out = model(input_ids=torch.tensor([token_ids], device=device), output_attentions=True)
    return out.attentions[layer][0, :, -1, :].float().tolist()


TABLE_BAND_ROWS = 8192  # the embedding view's float32 copy: a band of the table, not all of it


def _table_rows(table: torch.nn.Module, start: int, end: int) -> torch.Tensor:
    """Rows start..end of an input embedding table, as its lookups read them (unscaled): a table in
    a file's blocks (`inference.models.quant.BlockEmbedding`) dequantizes just those rows."""
    table_rows = getattr(table, "table_rows", None)
    return table_rows(start, end) if table_rows is not None else table.weight[start:end]


@torch.inference_mode()
def embedding_of(model, token_id: int, top_n: int = 8) -> dict[str, Any]:
    """A token's row of the input embedding table: its size, its norm (and the table's mean
    for scale) and the tokens whose rows point the most the same way (cosine). The table is read
    a band of rows at a time (gguf's is the file's blocks: dequantized here, never kept)."""
    table = model.get_input_embeddings()
    num_rows = table.num_embeddings
    if not 0 <= token_id < num_rows:
        raise ValueError(f"token id {token_id} is outside the embedding table (0..{num_rows - 1})")
    vector = _table_rows(table, token_id, token_id + 1).float()[0]
    norms, dots = [], []
    for start in range(0, num_rows, TABLE_BAND_ROWS):
        band = _table_rows(table, start, min(start + TABLE_BAND_ROWS, num_rows)).float()  # (rows, hidden)
        norms.append(band.norm(dim=-1))
        dots.append(band @ vector)
    norms = torch.cat(norms)
    cosine = torch.cat(dots) / (norms * vector.norm()).clamp_min(1e-12)
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
