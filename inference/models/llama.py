"""Lean runner for Llama-family checkpoints (Llama, Qwen2, Mistral without sliding window).

Owns: a forward pass with the same math as transformers' implementation but fewer, larger
ops: fused QKV and gate/up projections, a precomputed rotary table, and a preallocated
contiguous KV cache written in place. At batch 1 decode every op is a dispatch plus a
weight read, so fewer dispatches is most of the win over `model.generate` on a CPU. On a CPU
with the fused kernels built (`inference.kernels.cpu`) the pass runs on them (`fused.py`);
the torch ops here are the path everywhere else (GPU, no C compiler).
Must not know: sampling, requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from inference.kernels import cpu as cpu_kernels
from inference.kernels.cpu import KVAddress
from inference.kv.cache import ContiguousKVCache
from inference.models.fused import Attend, FusedLlama
from inference.models.loader import architecture_of
from inference.models.quant import QuantizedLinear, QuantizedWeight, Stacked, linear

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def supports(model) -> bool:
    """True when this runner reproduces the model exactly (otherwise use the generic runner)."""
    cfg = model.config
    arch = architecture_of(model)
    if type(model).__name__ not in SUPPORTED_ARCHITECTURES or arch not in SUPPORTED_ARCHITECTURES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) and arch != "LlamaForCausalLM":
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    if arch == "LlamaForCausalLM" and getattr(cfg, "attention_bias", False):
        return False
    return True


def _fuse(modules: list[torch.nn.Module], name: str) -> torch.Tensor | QuantizedWeight | None:
    """Concatenate the modules' `name` tensors into one, and point each module at its slice
    of it, so the fused copy costs no extra memory and transformers' path (beam search) still works."""
    if name == "weight" and isinstance(modules[0], QuantizedLinear):
        return _fuse_quantized(modules)
    parts = [getattr(m, name) for m in modules]
    if parts[0] is None:
        return None
    fused = torch.cat([p.detach() for p in parts]).contiguous()
    for module, piece in zip(modules, fused.split([p.shape[0] for p in parts])):
        setattr(module, name, torch.nn.Parameter(piece, requires_grad=False))
    return fused


def _fuse_quantized(modules: list[QuantizedLinear]) -> QuantizedWeight:
    parts = [m.qweight for m in modules]
    if not all(type(p) is type(parts[0]) for p in parts) or not type(parts[0]).can_join(parts):
        return Stacked(tuple(parts))  # packed layouts that cannot be joined: one matmul each
    fused = type(parts[0]).join(parts)
    start = 0
    for module, part in zip(modules, parts):
        module.set_weight(fused.rows(start, start + part.shape[0]))
        start += part.shape[0]
    return fused


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """One query per sequence: q (B, H, D), keys/values (B, KVH, L, D), mask (B, 1, 1, L) True
    where a key may be read -> (B, H, D). On a CPU, torch's fused attention kernel in bfloat16
    costs 34 us per layer at 40 tokens of context and 930 us at 2,000, against 24 and 162 us on
    float32 copies (measured with the cache's strided views), so low precisions attend in float32."""
    dtype = q.dtype
    if dtype != torch.float32 and q.device.type == "cpu":
        q, keys, values = q.float(), keys.float(), values.float()
    out = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=mask, enable_gqa=q.shape[1] != keys.shape[1]
    )  # (B, H, 1, D)
    return out[:, :, 0].to(dtype)


def prompt_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of T new tokens at positions start.. of one sequence: q (T, H, D) over
    keys/values (KVH, start + T, D), the cached prefix and themselves -> (T, H, D)."""
    num_new = q.shape[0]
    mask = None  # without a cached prefix, queries and keys align: the fused causal kernel needs no mask
    if start > 0:  # queries see the cached prefix plus their own causal part
        key_pos = torch.arange(start + num_new, device=q.device)
        mask = key_pos[None, :] <= torch.arange(start, start + num_new, device=q.device)[:, None]  # (T, start+T)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=q.shape[1] != keys.shape[0],
    )  # (1, H, T, D)
    return out[0].transpose(0, 1)


def _weight(module: torch.nn.Module) -> torch.Tensor | QuantizedWeight:
    return module.qweight if isinstance(module, QuantizedLinear) else module.weight


class _Layer:
    def __init__(self, layer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv_weight = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "weight")
        self.qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias")
        self.o_weight = _weight(attn.o_proj)
        self.gate_up_weight = _fuse([mlp.gate_proj, mlp.up_proj], "weight")
        self.down_weight = _weight(mlp.down_proj)
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight


class LlamaRunner:
    name = "lean-llama"

    def __init__(self, model, max_context: int, is_batch_invariant: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.intermediate_size = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.embed = model.model.embed_tokens.weight
        self.final_norm = model.model.norm.weight
        self.lm_head = _weight(model.lm_head)
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        positions = torch.arange(max_context, device=self.device)[None]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = model.model.rotary_emb(probe, positions)  # (1, max_context, head_dim) each
        self.cos, self.sin = cos[0], sin[0]
        kernels = cpu_kernels.load() if FusedLlama.supports(self) else None
        # None: torch ops (no C compiler, a GPU), which are not batch-invariant
        self.fused = FusedLlama(self, kernels, is_batch_invariant) if kernels is not None else None

    def new_cache(self, capacity: int) -> ContiguousKVCache:
        return ContiguousKVCache(
            len(self.layers), self.num_kv_heads, self.head_dim, max(capacity, 1), self.dtype, self.device
        )

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Transformers' LlamaRMSNorm (float32 statistics, cast back, then the weight); torch's
        # rms_norm composes the same ops in C++: one Python call instead of five (decode is op-bound).
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def split_rotate(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv (T, q + 2 kv), cos/sin (T, 1, D) -> q (T, H, D), k and v (T, KVH, D), with the rotary
        embedding applied to q and k in one pass (one set of ops for both: decode is op-bound)."""
        num_qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : self.q_size + self.kv_size].unflatten(-1, (num_qk_heads, self.head_dim))  # (T, H+KVH, D)
        half = self.head_dim // 2
        qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, qkv[:, self.q_size + self.kv_size :].unflatten(-1, (self.num_kv_heads, self.head_dim))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: ContiguousKVCache | None) -> torch.Tensor:
        """input_ids (T,) -> float32 logits (vocab,) of the last position; appends T tokens to `cache`."""
        num_new = input_ids.shape[0]
        if cache is None:  # "no KV cache" mode: a throwaway cache for this one pass
            cache = self.new_cache(num_new)
        if self.fused is not None:
            return self._fused_forward(input_ids, cache)
        cache.reserve(num_new)
        start = cache.num_tokens
        cos, sin = self.cos[start : start + num_new, None], self.sin[start : start + num_new, None]  # (T, 1, D)
        h = F.embedding(input_ids.to(self.device), self.embed)  # (T, hidden)
        for i, layer in enumerate(self.layers):
            h = h + self._attention(i, layer, self._rms_norm(h, layer.input_norm), cache, start, cos, sin)
            x = self._rms_norm(h, layer.post_norm)
            gate_up = linear(x, layer.gate_up_weight)  # (T, 2 * intermediate)
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            h = h + linear(F.silu(gate) * up, layer.down_weight)
        cache.advance(num_new)
        last = self._rms_norm(h[-1:], self.final_norm)  # only the last position's logits are needed
        return linear(last, self.lm_head)[0].float()  # (vocab,)

    def _fused_forward(self, input_ids: torch.Tensor, cache: ContiguousKVCache) -> torch.Tensor:
        """`forward` on the fused CPU kernels."""
        num_new = input_ids.shape[0]
        cache.reserve(num_new)
        start = cache.num_tokens
        positions = torch.arange(start, start + num_new)  # (T,): also their slots in this cache
        kv = KVAddress.layers(cache.buffer, slot_dim=3, head_dim=2)  # (layers, 2, KVH, capacity, D)
        if num_new == 1 or self.fused.is_batch_invariant:  # each row over positions 0..its own
            attend = self.fused.attend(kv, positions + 1, None, None)
        else:
            attend = self._prompt_attend(cache, start, num_new)
        logits = self.fused.forward(input_ids, positions, positions, kv, attend, slice(-1, None))  # (1, vocab)
        cache.advance(num_new)
        return logits[0]

    def _prompt_attend(self, cache: ContiguousKVCache, start: int, num_new: int) -> Attend:
        """The fast mode's attention for several new tokens: torch's fused kernel in float32 (the
        kernels hand q over in float32)."""

        def attend(i: int, q: torch.Tensor, out: torch.Tensor) -> None:
            keys, values = cache.buffer[i, 0, :, : start + num_new], cache.buffer[i, 1, :, : start + num_new]
            out.copy_(prompt_attention(q, keys.float(), values.float(), start))

        return attend

    def _attention(
        self,
        i: int,
        layer: _Layer,
        x: torch.Tensor,
        cache: ContiguousKVCache,
        start: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        num_new = x.shape[0]
        q, k, v = self.split_rotate(linear(x, layer.qkv_weight, layer.qkv_bias), cos, sin)  # (T, heads, D)
        keys, values = cache.write(i, k.transpose(0, 1), v.transpose(0, 1))  # (KVH, start+T, D)
        if num_new == 1:
            out = decode_attention(q[None, 0], keys[None], values[None])  # (1, H, D)
        else:
            out = prompt_attention(q, keys, values, start)  # (T, H, D)
        return linear(out.reshape(num_new, self.q_size), layer.o_weight)
