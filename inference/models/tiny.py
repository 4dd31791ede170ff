"""Tiny random Hugging Face models and a byte-level tokenizer, for tests and benchmarks.

Owns: deterministic, CPU-cheap stand-ins for real checkpoints (2-3 layers, hidden 32-64,
vocab 320) in the architectures the engine must handle, the same architectures at a size
where a forward pass costs what it costs in real models (`tiny_config(arch, scale=8)`, for
`python -m inference.bench batch --model tiny-gemma3`), and a 256-byte BPE tokenizer with
chosen special tokens and chat template. Nothing is downloaded.
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from inference.text.tokenization import bytes_to_unicode

TINY_VOCAB_SIZE = 320  # 256 byte tokens + room for special tokens
TINY_ARCHITECTURES = ("gpt2", "llama", "qwen2", "deepseek_v3", "gemma3")
_SHARED = dict(vocab_size=TINY_VOCAB_SIZE, bos_token_id=256, eos_token_id=257, pad_token_id=257)
# Llama, Qwen2 (QKV biases of its own) and the tests' Mistral share one shape
DENSE_SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
_DENSE = dict(**DENSE_SHAPE, **_SHARED)


def tiny_config(arch: str, scale: int = 1) -> PretrainedConfig:
    """A small config for `arch` (one of TINY_ARCHITECTURES); `scale` multiplies its widths
    (and so its matmuls' cost) and doubles its layers from 2 on."""
    config = _tiny_config(arch)
    if scale > 1:
        widths = {"hidden_size": scale, "intermediate_size": scale, "moe_intermediate_size": scale, "head_dim": 2}
        for name, factor in widths.items():
            if getattr(config, name, None):
                setattr(config, name, getattr(config, name) * factor)
        config.num_hidden_layers *= 2
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types * 2
    return config


def _tiny_config(arch: str) -> PretrainedConfig:
    if arch == "gemma3":
        # Gemma-3's local/global layers: two sliding-window layers, then a global one
        return Gemma3TextConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            max_position_embeddings=256,
            **_SHARED,
        )
    if arch == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **_SHARED)
    if arch == "llama":
        return LlamaConfig(**_DENSE)
    if arch == "qwen2":
        return Qwen2Config(**_DENSE)
    if arch == "deepseek_v3":
        # MLA (low-rank q and kv with a decoupled rope part) and MoE after one dense layer
        return DeepseekV3Config(
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            max_position_embeddings=256,
            **_SHARED,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHITECTURES}")


def make_tiny_model(arch: str, seed: int = 0, scale: int = 1) -> PreTrainedModel:
    """A randomly initialised float32 model in eval mode; the same seed gives the same weights."""
    config = tiny_config(arch, scale)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if arch == "deepseek_v3":
            # the router's bias starts at zero; give routing something to choose between
            for module in model.modules():
                bias = getattr(module, "e_score_correction_bias", None)
                if isinstance(bias, torch.Tensor):
                    bias.data.normal_(0.0, 0.1)
    return model.eval()


def make_tiny_tokenizer(
    special_tokens: list[str] | tuple[str, ...] = ("<|bos|>", "<|eos|>"),
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
    chat_template: str | None = None,
    plain_tokens: list[str] | tuple[str, ...] = (),
    add_bos_token: bool = False,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: id == byte for 0-255, then `special_tokens` from 256,
    then `plain_tokens`: added tokens that decoded text keeps (as R1's `<think>` and `</think>`).

    BOS and EOS default to the first and the last special token; `add_bos_token`: the tokenizer
    puts BOS before text it encodes (as Gemma's and Llama's do)."""
    vocab = {char: b for b, char in bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos_token or special_tokens[0], eos_token=eos_token or special_tokens[-1]
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if add_bos_token:
        tokenizer.add_bos_token = True  # rebuilds the post-processor that puts BOS first
    return tokenizer
