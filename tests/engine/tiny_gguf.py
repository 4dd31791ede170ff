"""Tiny GGUF files for conversion tests, written with the `gguf` package (as llama.cpp's
converter would): the tiny random Llama of `tiny_models` with a byte-level tokenizer, with or
without a chat template, in F32 or with chosen tensors quantized (Q4_0, Q5_0, Q8_0 ..., the
types gguf-py can write: a mixed file like a Q4_K_M one), and the tokenizer's `add_bos_token`
flag. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.quants import quantize as gguf_quantize
from transformers import PreTrainedModel

from inference.models.tiny import TINY_VOCAB_SIZE, make_tiny_model
from inference.text.tokenization import bytes_to_unicode

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf permutation of q/k (transformers reverses it)
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_gguf(
    path: Path,
    *,
    chat_template: str | None = None,
    eos: str = "<|eos|>",
    tensor_types: dict[str, gguf.GGMLQuantizationType] | None = None,
    add_bos_token: bool | None = None,
) -> PreTrainedModel:
    """Write the tiny Llama to `path` as a GGUF; returns the model whose weights it holds (as
    written: a quantized tensor holds the model's weights rounded by its type). `tensor_types`
    maps a GGUF tensor base name's last part ("attn_q", "ffn_down", "output") to its type; the
    rest is F32."""
    model = make_tiny_model("llama")
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(TINY_VOCAB_SIZE)
    _add_tokenizer(writer, chat_template, eos)
    if add_bos_token is not None:
        writer.add_add_bos_token(add_bos_token)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        weights = tensor.numpy().astype(np.float32)
        gguf_name = names.get_name(base)
        assert gguf_name, hf_name
        if gguf_name.endswith("attn_q"):
            weights = _permute(weights, config.num_attention_heads)
        elif gguf_name.endswith("attn_k"):
            weights = _permute(weights, config.num_key_value_heads)
        kind = (tensor_types or {}).get(gguf_name.rpartition(".")[2]) if suffix == "weight" else None
        if kind is None:
            writer.add_tensor(f"{gguf_name}.{suffix}", weights)
        else:
            writer.add_tensor(f"{gguf_name}.{suffix}", gguf_quantize(weights, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _add_tokenizer(writer: gguf.GGUFWriter, chat_template: str | None, eos: str) -> None:
    byte_tokens = [bytes_to_unicode()[b] for b in range(256)]
    padding = [f"<|unused{i}|>" for i in range(TINY_VOCAB_SIZE - 257 - len(SPECIAL_TOKENS))]
    tokens = [*byte_tokens, *SPECIAL_TOKENS, "ab", *padding]  # one merge: transformers needs merges
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    types = [normal] * 256 + [control] * len(SPECIAL_TOKENS) + [normal] + [control] * len(padding)
    writer.add_token_types(types)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(tokens.index("<|bos|>"))
    writer.add_eos_token_id(tokens.index(eos))
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def truncate(path: Path, keep: int) -> None:
    """Cut `path` to its first `keep` bytes (negative: drop that many from the end)."""
    data = path.read_bytes()
    path.write_bytes(data[:keep])
