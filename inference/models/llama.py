"""Lean runner for Llama-family checkpoints (Llama, Qwen2, Mistral without sliding window).

Owns: the model's weights laid out for fewer, larger ops (fused QKV and gate/up projections,
a precomputed rotary table) and the pieces of the same math as transformers' implementation
(RMSNorm, rotary, attention of decodes and of prompt chunks). At batch 1 decode every op is a
dispatch plus a weight read, so fewer dispatches is most of the win over transformers on a
CPU. The whole step's pass is `batched_llama.py`'s; on a CPU with the fused kernels built
(`inference.kernels.cpu`) it runs on them (`fused.py`), the torch ops here everywhere else
(GPU, no C compiler). Must not know: sampling, requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from inference.kernels import cpu as cpu_kernels
from inference.models.fused import FusedLlama
from inference.models.loader import architecture_of
from inference.models.memory import release_free_memory
from inference.models.quant import QuantizedLinear, QuantizedWeight, Stacked

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
        self.embed = model.model.embed_tokens  # an nn.Embedding, or gguf's BlockEmbedding (the file's blocks)
        self.final_norm = model.model.norm.weight
        self.lm_head = _weight(model.lm_head)
        self.layers = []
        for layer in model.model.layers:
            self.layers.append(_Layer(layer))
            # The layer's separate weights, now copied into its fused ones, were freed into the heap
            # below glibc's mmap threshold: without a trim, a float32 model kept ~1 GB of them resident.
            release_free_memory()
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        positions = torch.arange(max_context, device=self.device)[None]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = model.model.rotary_emb(probe, positions)  # (1, max_context, head_dim) each
        self.cos, self.sin = cos[0], sin[0]
        kernels = cpu_kernels.load() if FusedLlama.supports(self) else None
        # None: torch ops (no C compiler, a GPU), which are not batch-invariant
        self.fused = FusedLlama(self, kernels, is_batch_invariant) if kernels is not None else None

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
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
