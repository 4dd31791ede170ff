"""The architecture card: what a model costs, computed from its config alone (no weights, no torch).

Owns: reading a config (a Hugging Face `config.json` of a Llama / Qwen2 / Mistral / GPT-2 /
DeepSeek-V2/V3 model, the `inference/configs/*.json` format of DeepSeek's own repository, or a
GGUF file's header: `config_from_gguf`) into a `Shape`, and from it: total and active parameters
per token, KV cache bytes per token (the cached form, MLA's latent against the same model with
expanded K/V), FLOPs per token for prefill and decode, and bytes read per decoded token at batch
1. The reference configs shipped in `reference_configs/` (DeepSeek-V3 671B, V3.1, V2-Lite 16B,
the six R1 distills) are listed by `REFERENCE_MODELS`.

Must not know: torch, transformers, Django. The web process imports it; the tests check every
count against meta-device models transformers builds from the same configs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.introspect.vision_tokens import vision_section

if TYPE_CHECKING:
    from inference.gguf_file import GgufHeader

REFERENCE_DIR = Path(__file__).with_name("reference_configs")
REFERENCE_MODELS: dict[str, str] = {
    "deepseek_v3_671b": "DeepSeek-V3 / R1 (671B)",
    "deepseek_v3_1_671b": "DeepSeek-V3.1 (671B)",
    "deepseek_v2_lite_16b": "DeepSeek-V2-Lite (16B)",
    "deepseek_r1_distill_qwen_1_5b": "DeepSeek-R1-Distill-Qwen-1.5B",
    "deepseek_r1_distill_qwen_7b": "DeepSeek-R1-Distill-Qwen-7B",
    "deepseek_r1_distill_qwen_14b": "DeepSeek-R1-Distill-Qwen-14B",
    "deepseek_r1_distill_qwen_32b": "DeepSeek-R1-Distill-Qwen-32B",
    "deepseek_r1_distill_llama_8b": "DeepSeek-R1-Distill-Llama-8B",
    "deepseek_r1_distill_llama_70b": "DeepSeek-R1-Distill-Llama-70B",
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
MAX_CONTEXT = 1 << 22  # a card for a context beyond 4M tokens is not a question anyone asks
_LLAMA_LIKE = {"llama", "mistral", "qwen2"}
_DEEPSEEK = {"deepseek_v2", "deepseek_v3"}


class ArchitectureError(ValueError):
    """The config is not one this card understands; the message says which field or type."""


@dataclass(frozen=True)
class Shape:
    """Everything the counts need; MLA and MoE fields are zero for models without them."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool
    qkv_bias: bool = False
    positions: int = 0  # learned position embeddings (GPT-2); 0 for rotary models
    # MLA (DeepSeek): a low-rank query, a shared latent for keys and values, a decoupled rope key
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # MoE (DeepSeek): the first `dense_layers` layers have a dense MLP, the rest routed experts
    dense_layers: int = 0
    experts: int = 0
    shared_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    expert_groups: int = 1
    groups_per_token: int = 1
    routed_scale: float = 1.0
    weights_dtype: str = "bfloat16"

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0


def _need(config: dict[str, Any], *names: str) -> list[int]:
    missing = [name for name in names if not isinstance(config.get(name), int)]
    if missing:
        raise ArchitectureError(f"the config has no integer {', '.join(missing)}")
    return [int(config[name]) for name in names]


def _weights_dtype(config: dict[str, Any]) -> str:
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return dtype if dtype in DTYPE_BYTES else "bfloat16"


def hf_config_from_deepseek_repo(config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek's repository format (`dim`, `n_layers`, ...) as `DeepseekV3Config` fields."""
    dim, inter, moe_inter, layers, dense, heads, vocab = _need(
        config, "dim", "inter_dim", "moe_inter_dim", "n_layers", "n_dense_layers", "n_heads", "vocab_size"
    )
    q_lora_rank = int(config.get("q_lora_rank") or 0)
    return {
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": dim,
        "intermediate_size": inter,
        "moe_intermediate_size": moe_inter,
        "num_hidden_layers": layers,
        "first_k_dense_replace": dense,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "n_routed_experts": int(config.get("n_routed_experts", 64)),
        "n_shared_experts": int(config.get("n_shared_experts", 2)),
        "num_experts_per_tok": int(config.get("n_activated_experts", 6)),
        "n_group": int(config.get("n_expert_groups", 1)),
        "topk_group": int(config.get("n_limited_groups", 1)),
        "routed_scaling_factor": float(config.get("route_scale", 1.0)),
        "q_lora_rank": q_lora_rank or None,
        "kv_lora_rank": int(config.get("kv_lora_rank", 512)),
        "qk_nope_head_dim": int(config.get("qk_nope_head_dim", 128)),
        "qk_rope_head_dim": int(config.get("qk_rope_head_dim", 64)),
        "v_head_dim": int(config.get("v_head_dim", 128)),
        "tie_word_embeddings": False,
        "torch_dtype": config.get("dtype", "bfloat16"),
    }


def config_from_gguf(header: GgufHeader) -> dict[str, Any]:
    """A GGUF file's shape as the `config.json` fields this card reads, from its header alone
    (`inference.gguf_file.read_header`: no weights read, no conversion). Metadata keys are
    llama.cpp's `<architecture>.<field>`; the vocabulary is the embedding table's rows, a tied
    head is a file without `output.weight`. The dtype is float32, what the conversion to a
    Hugging Face folder writes (so the card equals the converted folder's); `?dtype=` shows others."""
    arch = header.architecture or ""
    meta = header.metadata
    tensors = {t.name: t.shape for t in header.tensors}

    def value(field: str) -> Any:
        return meta.get(f"{arch}.{field}")

    embedding = tensors.get("token_embd.weight")
    vocab = embedding[0] if embedding else value("vocab_size") or header.vocab_size
    hidden, heads = value("embedding_length"), value("attention.head_count")
    layers, inter, context = value("block_count"), value("feed_forward_length"), value("context_length")
    if arch == "gpt2":  # transformers' GPT-2 names
        return {"model_type": "gpt2", "vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                "n_positions": context, "n_inner": inter, "torch_dtype": "float32"}  # fmt: skip
    config = {
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": value("attention.head_count_kv") or heads,
        "head_dim": value("attention.key_length"),
        "intermediate_size": inter,
        "max_position_embeddings": context,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "torch_dtype": "float32",
    }
    window = value("attention.sliding_window")
    return config | ({"sliding_window": window} if window else {})


def shape_from_config(config: dict[str, Any]) -> Shape:
    """A `Shape` from a config dict in either format; `ArchitectureError` when it cannot be read."""
    if not isinstance(config, dict):
        raise ArchitectureError("the config must be a JSON object")
    if "dim" in config and "n_layers" in config:
        config = hf_config_from_deepseek_repo(config)
    model_type = config.get("model_type")
    if model_type in _DEEPSEEK:
        return _deepseek_shape(config)
    if model_type in _LLAMA_LIKE:
        vocab, hidden, layers, heads, inter = _need(
            config, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"
        )
        kv_heads = int(config.get("num_key_value_heads") or heads)
        return Shape(
            model_type=model_type,
            vocab=vocab,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=inter,
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            weights_dtype=_weights_dtype(config),
        )
    if model_type == "gpt2":
        vocab, hidden, layers, heads, positions = _need(
            config, "vocab_size", "n_embd", "n_layer", "n_head", "n_positions"
        )
        return Shape(
            model_type="gpt2",
            vocab=vocab,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=heads,
            head_dim=hidden // heads,
            intermediate=int(config.get("n_inner") or 4 * hidden),
            tied_embeddings=True,
            qkv_bias=True,
            positions=positions,
            weights_dtype=_weights_dtype(config),
        )
    raise ArchitectureError(
        f"model_type {model_type!r} has no architecture card; known: {', '.join(sorted(_LLAMA_LIKE | _DEEPSEEK))}, gpt2"
    )


def _deepseek_shape(config: dict[str, Any]) -> Shape:
    vocab, hidden, layers, heads, inter = _need(
        config, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"
    )
    experts = int(config.get("n_routed_experts") or 0)
    return Shape(
        model_type=config["model_type"],
        vocab=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=int(config.get("qk_nope_head_dim", 128)) + int(config.get("qk_rope_head_dim", 64)),
        intermediate=inter,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", False)),
        q_lora_rank=int(config.get("q_lora_rank") or 0),
        kv_lora_rank=int(config.get("kv_lora_rank", 512)),
        qk_nope_dim=int(config.get("qk_nope_head_dim", 128)),
        qk_rope_dim=int(config.get("qk_rope_head_dim", 64)),
        v_head_dim=int(config.get("v_head_dim", 128)),
        dense_layers=min(layers, int(config.get("first_k_dense_replace") or 0)) if experts else layers,
        experts=experts,
        shared_experts=int(config.get("n_shared_experts") or 0),
        experts_per_token=int(config.get("num_experts_per_tok") or 0),
        moe_intermediate=int(config.get("moe_intermediate_size") or 0),
        expert_groups=int(config.get("n_group") or 1),
        groups_per_token=int(config.get("topk_group") or 1),
        routed_scale=float(config.get("routed_scaling_factor") or 1.0),
        weights_dtype=_weights_dtype(config),
    )


# Parameters ------------------------------------------------------------------------------


def attention_parameters(s: Shape) -> int:
    """One layer's attention projections (and, for MLA, its two low-rank norms)."""
    d, h = s.hidden, s.heads
    if s.model_type == "gpt2":
        return d * 3 * d + 3 * d + d * d + d
    if s.is_mla:
        bias = s.qkv_bias
        qk = s.qk_nope_dim + s.qk_rope_dim
        if s.q_lora_rank:
            q = d * s.q_lora_rank + bias * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * h * qk
        else:
            q = d * h * qk
        kv_a = d * (s.kv_lora_rank + s.qk_rope_dim) + bias * (s.kv_lora_rank + s.qk_rope_dim) + s.kv_lora_rank
        return q + kv_a + kv_b_parameters(s) + h * s.v_head_dim * d + bias * d
    q, kv = h * s.head_dim, s.kv_heads * s.head_dim
    return d * (q + 2 * kv) + s.qkv_bias * (q + 2 * kv) + q * d


def kv_b_parameters(s: Shape) -> int:
    """MLA's up-projection from the latent to every head's key (no rope part) and value."""
    return s.kv_lora_rank * s.heads * (s.qk_nope_dim + s.v_head_dim) if s.is_mla else 0


def _mlp(hidden: int, inter: int, gpt2: bool = False) -> int:
    return 2 * hidden * inter + inter + hidden if gpt2 else 3 * hidden * inter


def parameter_counts(s: Shape) -> dict[str, int]:
    """Parameters by part; `total` as `model.parameters()` counts them, `active` per token."""
    d = s.hidden
    norms_per_layer = 4 * d if s.model_type == "gpt2" else 2 * d
    embedding = s.vocab * d + s.positions * d
    lm_head = 0 if s.tied_embeddings else s.vocab * d
    attention = s.layers * attention_parameters(s)
    dense_mlp = s.dense_layers * _mlp(d, s.intermediate, s.model_type == "gpt2") if s.experts else 0
    if not s.experts:
        dense_mlp = s.layers * _mlp(d, s.intermediate, s.model_type == "gpt2")
    expert = _mlp(d, s.moe_intermediate)
    routed = s.moe_layers * s.experts * expert
    shared = s.moe_layers * _mlp(d, s.moe_intermediate * s.shared_experts) if s.shared_experts else 0
    router = s.moe_layers * s.experts * d
    norms = s.layers * norms_per_layer + (2 * d if s.model_type == "gpt2" else d)
    total = embedding + lm_head + attention + dense_mlp + routed + shared + router + norms
    unused_experts = s.moe_layers * (s.experts - s.experts_per_token) * expert
    return {
        "embedding": embedding,
        "lm_head": lm_head,
        "attention": attention,
        "dense_mlp": dense_mlp,
        "routed_experts": routed,
        "shared_experts": shared,
        "router": router,
        "norms": norms,
        "total": total,
        "active": total - unused_experts,
        "active_routed_experts": s.moe_layers * s.experts_per_token * expert,
    }


# KV cache --------------------------------------------------------------------------------


def kv_values_per_token(s: Shape) -> dict[str, int]:
    """Values cached per token (all layers): `cached` is what the model keeps; for MLA,
    `expanded` is the same model caching every head's full key and value instead."""
    if s.is_mla:
        latent = s.layers * (s.kv_lora_rank + s.qk_rope_dim)
        expanded = s.layers * s.heads * (s.qk_nope_dim + s.qk_rope_dim + s.v_head_dim)
        return {"cached": latent, "expanded": expanded, "form": "mla_latent"}
    cached = s.layers * 2 * s.kv_heads * s.head_dim
    form = "mha" if s.kv_heads == s.heads else "gqa"
    return {"cached": cached, "expanded": s.layers * 2 * s.heads * s.head_dim, "form": form}


# FLOPs and bytes -------------------------------------------------------------------------


def matmul_parameters(s: Shape) -> int:
    """Weights multiplied once per token (2 FLOPs each): active minus lookups and norms."""
    counts = parameter_counts(s)
    return counts["active"] - counts["embedding"] - counts["norms"] + (s.vocab * s.hidden if s.tied_embeddings else 0)


def attention_flops_per_key(s: Shape) -> int:
    """FLOPs of one query against one cached position, all layers: scores plus the weighted values."""
    qk = s.qk_nope_dim + s.qk_rope_dim if s.is_mla else s.head_dim
    v = s.v_head_dim if s.is_mla else s.head_dim
    return s.layers * 2 * s.heads * (qk + v)


def decode_flops(s: Shape, context: int) -> dict[str, int]:
    """One decoded token with `context` positions in the cache (itself included).

    `as_run`: as transformers runs MLA, re-expanding every cached latent through kv_b each step;
    `absorbed`: kv_b folded into the query and output (DeepSeek's inference), attending over latents."""
    linear = 2 * matmul_parameters(s)
    standard = linear + attention_flops_per_key(s) * context
    if not s.is_mla:
        return {"as_run": standard, "absorbed": standard}
    expand = 2 * s.layers * kv_b_parameters(s) * context - 2 * s.layers * kv_b_parameters(s)
    absorbed_attention = s.layers * 2 * s.heads * (2 * s.kv_lora_rank + s.qk_rope_dim) * context
    return {"as_run": standard + expand, "absorbed": linear + absorbed_attention}


def prefill_flops(s: Shape, prompt: int, *, cached: int = 0, logits: int | None = None) -> int:
    """A `prompt`-token prefill in one pass (causal: position t attends to t positions).

    The first `cached` positions came from the prefix cache: attended to, not computed again.
    `logits`: positions whose output logits are computed (default every computed one; the
    engine's runners compute only the last, the one it samples from)."""
    computed = prompt - cached
    head_skipped = 0 if logits is None else 2 * s.vocab * s.hidden * (computed - logits)
    attention = attention_flops_per_key(s) * (prompt * (prompt + 1) - cached * (cached + 1)) // 2
    return 2 * matmul_parameters(s) * computed - head_skipped + attention


def decode_bytes_read(s: Shape, context: int, weight_bytes: int, kv_bytes: int) -> dict[str, int]:
    """Batch 1: every weight the token touches once (one embedding row; only the chosen experts)
    plus the whole KV cache."""
    counts = parameter_counts(s)
    embedding_rows_unread = 0 if s.tied_embeddings else counts["embedding"] - s.hidden
    weights = (counts["active"] - embedding_rows_unread) * weight_bytes
    kv = kv_values_per_token(s)["cached"] * kv_bytes * context
    return {"weights": weights, "kv_cache": kv, "total": weights + kv}


# The card --------------------------------------------------------------------------------


def card(config: dict[str, Any], *, context: int = 4096, dtype: str | None = None, name: str = "") -> dict[str, Any]:
    """The JSON card. `dtype` sets the weights' and the cache's bytes per value (default: the
    config's, the cache in bfloat16 unless the weights are float32)."""
    if not isinstance(context, int) or not 1 <= context <= MAX_CONTEXT:
        raise ArchitectureError(f"context must be an integer from 1 to {MAX_CONTEXT}, not {context!r}")
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise ArchitectureError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, not {dtype!r}")
    s = shape_from_config(_language_config(config))
    weights_dtype = dtype or s.weights_dtype
    kv_dtype = dtype if dtype and dtype != "fp8" else ("float32" if weights_dtype == "float32" else "bfloat16")
    wb, kb = DTYPE_BYTES[weights_dtype], DTYPE_BYTES[kv_dtype]
    kv = kv_values_per_token(s)
    params = parameter_counts(s)
    return {
        "name": name,
        "shape": asdict(s) | {"is_mla": s.is_mla, "moe_layers": s.moe_layers},
        "parameters": params,
        "weights": {"dtype": weights_dtype, "bytes": params["total"] * wb, "active_bytes": params["active"] * wb},
        "kv_cache": {
            "form": kv["form"],
            "dtype": kv_dtype,
            "values_per_token": kv["cached"],
            "bytes_per_token": kv["cached"] * kb,
            "expanded_values_per_token": kv["expanded"],
            "expanded_bytes_per_token": kv["expanded"] * kb,
            "context": context,
            "bytes_at_context": kv["cached"] * kb * context,
            "expanded_bytes_at_context": kv["expanded"] * kb * context,
            # Attention to the last N tokens only: the cache then holds at most N positions, and a
            # conversation longer than N cannot be reused from the prefix cache.
            "sliding_window": _sliding_window(config),
        },
        "flops": {
            "context": context,
            "decode_per_token": decode_flops(s, context),
            # Logits at the last position only, as the runners (and vLLM, llama.cpp) compute them:
            # every position's would add 2 x vocab x hidden per token (+21% for SmolLM2).
            "prefill_total": prefill_flops(s, context, logits=1),
            "prefill_per_token": prefill_flops(s, context, logits=1) // context,
        },
        "decode_bytes_read": decode_bytes_read(s, context, wb, kb),
        # A vision-language model: the counts above are its language model's; images' tokens here.
        "vision": vision_section(config, kv["cached"] * kb) if isinstance(config, dict) else None,
    }


def _language_config(config: Any) -> Any:
    """A vision-language config's `text_config` (with the outer dtype when it names none)."""
    text = config.get("text_config") if isinstance(config, dict) else None
    if not isinstance(text, dict):
        return config
    return {"torch_dtype": config.get("torch_dtype") or config.get("dtype"), **text}


def _sliding_window(config: dict[str, Any]) -> int | None:
    window = config.get("sliding_window")
    return window if window and config.get("use_sliding_window", True) else None


def reference_config(key: str) -> dict[str, Any]:
    """One of `REFERENCE_MODELS`' configs as shipped; `KeyError` for an unknown key."""
    if key not in REFERENCE_MODELS:
        raise KeyError(key)
    return json.loads((REFERENCE_DIR / f"{key}.json").read_text())


def reference_card(key: str, *, context: int = 4096, dtype: str | None = None) -> dict[str, Any]:
    # DeepSeek's real V3 weights are fp8; the card counts bf16 unless asked, as most runtimes load them
    config = reference_config(key)
    default = None if config.get("dtype") != "fp8" else "bfloat16"
    return card(config, context=context, dtype=dtype or default, name=REFERENCE_MODELS[key])
