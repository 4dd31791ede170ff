"""The Llama-family forward pass on the fused CPU kernels (`inference.kernels.cpu`).

Owns: the layers' math between the matmuls for any rows (a prompt's, a decode step's, a batch's
mixed step). At one token per step torch would run ~25 small ops per layer between the four
matmuls (casts, norms, rotary, cache writes, attention views) at ~1.5-2 us each: more than the
int4 matmuls themselves. Here each stretch is one kernel call: norm (+ residual add), rotary + KV
write, SiLU-gate, and decode attention. The residual stream stays float32 between layers (the
matmuls read bfloat16 copies), so low precisions also round less than the torch path does.
Batch invariance (the default): every row goes through the same kernels in the same order
whatever else shares its step, the matmuls included (`models/matmul.py`), and a prompt's rows
attend through the decode kernel one query at a time (`attend`), so a token's logits are
bitwise the same alone or batched, in a full prompt, a chunk of one, after a prefix-cache hit
or in a decode step. The fast mode (`is_batch_invariant=False`) uses torch's matmuls for float
weights and the caller's prompt attention (torch's fused kernel): faster where torch's kernels
beat ours (oneDNN's AMX bfloat16 prefill), but a row's last bits then depend on its company.
Must not know: sampling, requests, the cache's layout (callers pass `KVAddress`es and slots) or
how a prompt's rows attend in the fast mode (callers pass `attend`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from inference.kernels.cpu import CpuKernels, KVAddress
from inference.models.matmul import invariant_linear
from inference.models.quant import linear

FUSED_DTYPES = (torch.float32, torch.bfloat16)  # what the kernels read and write

# attend(layer, q (T, H, D) float32 rotated, out (T, H, D) activation dtype): each row's attention
# over its sequence's cached keys and values (the kernels wrote the step's own already).
Attend = Callable[[int, torch.Tensor, torch.Tensor], None]


class FusedLlama:
    def __init__(self, lean, kernels: CpuKernels, is_batch_invariant: bool = True) -> None:
        """`lean`: a `LlamaRunner` (its fused weights, rotary tables and sizes)."""
        self.lean, self.kernels = lean, kernels
        self.is_batch_invariant = is_batch_invariant
        self.linear = invariant_linear if is_batch_invariant else linear
        # The kernels take norm weights and rotary tables in float32 (tiny: copied once).
        self.input_norms = [layer.input_norm.float().contiguous() for layer in lean.layers]
        self.post_norms = [layer.post_norm.float().contiguous() for layer in lean.layers]
        self.final_norm = lean.final_norm.float().contiguous()
        self.cos, self.sin = lean.cos.float().contiguous(), lean.sin.float().contiguous()  # (max_context, D)

    @staticmethod
    def supports(lean) -> bool:
        return lean.device.type == "cpu" and lean.dtype in FUSED_DTYPES

    def attend(
        self, kv: Sequence[KVAddress], lengths: torch.Tensor, slots: torch.Tensor | None, starts: torch.Tensor | None
    ) -> Attend:
        """`attend` for rows that each read their own cached positions (decode and prompt rows
        alike): row t over lengths[t] positions whose slots are slots[starts[t]:][:lengths[t]]
        (int64), or slots 0.. when `slots` is None."""
        num_kv_heads, kernels = self.lean.num_kv_heads, self.kernels

        def attend(i: int, q: torch.Tensor, out: torch.Tensor) -> None:
            kernels.attention(q, kv[i], num_kv_heads, lengths, slots, starts, out)

        return attend

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: Sequence[KVAddress],
        attend: Attend,
        logit_rows: torch.Tensor | slice,
        residuals: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """input_ids, positions, slots (T,) int64: row t's token, its position in its sequence and
        the cache slot its keys and values go to; kv[i]: where layer i's cache is. -> float32
        logits (S, vocab) of `logit_rows`. `residuals`, when given, receives the residual stream
        (S, hidden) float32 at `logit_rows` after the embedding and after each layer."""
        lean, k, linear = self.lean, self.kernels, self.linear
        num_rows, eps = input_ids.shape[0], lean.eps
        h = lean.embed(input_ids).float()  # (T, hidden): the residual stream, float32
        x = torch.empty(h.shape, dtype=lean.dtype)  # (T, hidden) normed: the matmuls' input
        q = torch.empty(num_rows, lean.num_heads, lean.head_dim)  # (T, H, D) float32
        attended = torch.empty(num_rows, lean.num_heads, lean.head_dim, dtype=lean.dtype)
        act = torch.empty(num_rows, lean.intermediate_size, dtype=lean.dtype)  # (T, I)
        cos, sin = self.cos[positions], self.sin[positions]  # (T, D)
        norms = [*self.input_norms[1:], self.final_norm]
        k.add_rms_norm(h, None, self.input_norms[0], x, eps)
        if residuals is not None:
            residuals.append(h[logit_rows].clone())
        for i, layer in enumerate(lean.layers):
            k.rope_write_kv(linear(x, layer.qkv_weight, layer.qkv_bias), cos, sin, q, kv[i], slots)
            attend(i, q, attended)
            k.add_rms_norm(h, linear(attended.view(num_rows, lean.q_size), layer.o_weight), self.post_norms[i], x, eps)
            k.silu_mul(linear(x, layer.gate_up_weight), act)
            k.add_rms_norm(h, linear(act, layer.down_weight), norms[i], x, eps)  # and the next layer's norm
            if residuals is not None:
                residuals.append(h[logit_rows].clone())
        return linear(x[logit_rows], lean.lm_head, out_dtype=torch.float32)  # (S, vocab): summed and written in float32

    @torch.inference_mode()
    def read_out(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm and output layer on residual rows h (S, hidden) float32 -> (S, vocab)
        float32, with `forward`'s kernels: on the last layer's rows, `forward`'s own logits."""
        x = torch.empty(h.shape, dtype=self.lean.dtype)
        self.kernels.add_rms_norm(h.clone(), None, self.final_norm, x, self.lean.eps)
        return self.linear(x, self.lean.lm_head, out_dtype=torch.float32)
