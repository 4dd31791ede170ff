"""Tiny GGUF files for conversion tests, written with the `gguf` package (as llama.cpp's
converter would): a tiny random model of `tiny_models` (Llama by default, or Gemma-3, whose
norms llama.cpp stores as `1 + w`) with a byte-level tokenizer, with or without a chat
template, in F32 or with chosen tensors quantized (Q4_0, Q5_0, Q8_0 ..., the types gguf-py can
write: a mixed file like a Q4_K_M one), and the tokenizer's `add_bos_token` flag; and a tiny
Qwen2-MoE, whose experts the file splits where transformers' model merges them. Nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.quants import quantize as gguf_quantize
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2MoeConfig

from inference.models.tiny import TINY_VOCAB_SIZE, make_tiny_model
from inference.text.tokenization import bytes_to_unicode

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GGUF_ARCHITECTURES = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}


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
    arch: str = "llama",
    scale: int = 1,
    chat_template: str | None = None,
    eos: str = "<|eos|>",
    tensor_types: dict[str, gguf.GGMLQuantizationType] | None = None,
    add_bos_token: bool | None = None,
) -> PreTrainedModel:
    """Write the tiny `arch` model (one of GGUF_ARCHITECTURES; `scale` as `tiny_config`'s) to
    `path` as a GGUF; returns the model whose weights it holds (as written: a quantized tensor
    holds the model's weights rounded by its type). `tensor_types` maps a GGUF tensor base name's
    last part ("attn_q", "ffn_down", "output") to its type; the rest is F32."""
    model = make_tiny_model(arch, scale=scale)
    config = model.config
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[GGUF_ARCHITECTURES[arch]])
    writer.add_name(f"tiny-{arch}")
    _add_shape(writer, arch, config)
    writer.add_vocab_size(TINY_VOCAB_SIZE)
    _add_tokenizer(writer, chat_template, eos)
    if add_bos_token is not None:
        writer.add_add_bos_token(add_bos_token)
    names = gguf.get_tensor_name_map(GGUF_ARCHITECTURES[arch], config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, tensor in model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = names.get_name(base)
        assert gguf_name, hf_name
        if gguf_name == "output" and tied:
            continue  # the embedding table is the head: the file has no output tensor
        weights = _as_llama_cpp_writes(arch, gguf_name, suffix, tensor.numpy().astype(np.float32), config)
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


def _add_shape(writer: gguf.GGUFWriter, arch: str, config: Any) -> None:
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    if arch == "llama":
        writer.add_rope_dimension_count(config.head_dim)  # transformers reads Llama's head_dim from it
    if arch == "gemma3":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)


def _as_llama_cpp_writes(arch: str, gguf_name: str, suffix: str, weights: np.ndarray, config: Any) -> np.ndarray:
    """The tensor as llama.cpp's converter stores it (the GGUF loaders undo each of these)."""
    kind = gguf_name.rpartition(".")[2]
    if arch == "llama" and kind == "attn_q":
        return _permute(weights, config.num_attention_heads)
    if arch == "llama" and kind == "attn_k":
        return _permute(weights, config.num_key_value_heads)
    if arch == "gemma3" and kind.endswith("norm") and suffix == "weight":
        return weights + 1  # Gemma's RMSNorm multiplies by 1 + w; llama.cpp's by the stored value
    return weights


def write_tiny_moe_gguf(path: Path) -> PreTrainedModel:
    """A tiny random Qwen2-MoE as llama.cpp writes it: each layer's experts as three 3-D tensors,
    gate and up apart (transformers' model holds them as one `gate_up_proj`), the shared expert's
    gate as a vector. Returns the model whose weights it holds."""
    config = Qwen2MoeConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_id=257,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        for param in model.parameters():
            param.data.normal_()  # routers and experts start at zero or one: make every value count
    writer = gguf.GGUFWriter(str(path), "qwen2moe")
    _add_shape(writer, "qwen2moe", config)
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_vocab_size(TINY_VOCAB_SIZE)
    _add_tokenizer(writer, None, "<|eos|>")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2MOE, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        weights = tensor.numpy()
        if hf_name.endswith("experts.gate_up_proj"):  # (E, 2I, H): gate rows, then up rows
            block, half = hf_name.split(".")[2], weights.shape[1] // 2
            writer.add_tensor(f"blk.{block}.ffn_gate_exps.weight", np.ascontiguousarray(weights[:, :half]))
            writer.add_tensor(f"blk.{block}.ffn_up_exps.weight", np.ascontiguousarray(weights[:, half:]))
            continue
        base, suffix = (hf_name, "weight") if hf_name.endswith("experts.down_proj") else hf_name.rsplit(".", 1)
        gguf_name = names.get_name(base)
        assert gguf_name, hf_name
        if gguf_name.endswith("ffn_gate_inp_shexp"):
            weights = weights.reshape(-1)  # (1, H) in transformers, a vector in the file
        writer.add_tensor(f"{gguf_name}.{suffix}", weights)
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
