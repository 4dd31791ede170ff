"""The KV cache's size from the model's shapes: what each token costs and why.

Owns: bytes per token per layer = 2 (a key and a value) x KV heads x head size x bytes per
element (multi-head latent attention, DeepSeek's MLA, keeps one compressed latent plus a
rotary key per token instead), and a request's cache per layer and in total.
Must not know: requests, Django.
"""

from __future__ import annotations

from typing import Any


def kv_shape(model) -> dict[str, Any]:
    """The per-token formula of `model`'s KV cache."""
    cfg = model.config
    element = next(model.parameters()).element_size()
    num_layers = cfg.num_hidden_layers
    if getattr(cfg, "kv_lora_rank", None):  # MLA: the latent and the rotary part of the key
        per_layer = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * element
        formula = f"({cfg.kv_lora_rank} latent + {cfg.qk_rope_head_dim} rotary key) x {element} B"
        return _shape(num_layers, per_layer, element, formula, kind="mla")
    num_heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or num_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
    per_layer = 2 * kv_heads * head_dim * element
    formula = f"2 (key and value) x {kv_heads} KV heads x {head_dim} head size x {element} B"
    shape = _shape(num_layers, per_layer, element, formula, kind="mha" if kv_heads == num_heads else "gqa")
    shape.update(num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim)
    return shape


def _shape(num_layers: int, per_layer: int, element: int, formula: str, kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "num_layers": num_layers,
        "element_bytes": element,
        "bytes_per_token_per_layer": per_layer,
        "bytes_per_token": per_layer * num_layers,
        "formula": formula,
    }


def request_kv(shape: dict[str, Any], num_tokens: int, num_cached_tokens: int) -> dict[str, Any]:
    """A request's cache of `num_tokens` positions, of which the first `num_cached_tokens` came
    from the prefix cache (computed by an earlier request)."""
    per_layer = shape["bytes_per_token_per_layer"] * num_tokens
    return {
        "num_tokens": num_tokens,
        "num_cached_tokens": num_cached_tokens,
        "bytes_per_layer": per_layer,
        "total_bytes": per_layer * shape["num_layers"],
        "cached_bytes": shape["bytes_per_token"] * num_cached_tokens,
    }
