"""The forward pass's matrix products on the batch-invariant kernels.

Owns: `invariant_linear`, which sends x (T, in) @ weight.T to the fused kernels' `matmul.c` for
float32 and bfloat16 weights as well as the packed int8/int4 ones (`quant.py`), so every output
of a row is summed in one fixed order whatever other rows share the call: a token's numbers are
the same alone, in a batch, in a prompt chunk or in a decode step. torch's CPU matmuls do not
promise that (measured: float32 GEMV for one row and GEMM for several round differently).
Must not know: layers, requests, which runner calls it.
"""

from __future__ import annotations

import torch

from inference.kernels import cpu as cpu_kernels
from inference.models.quant import QuantizedWeight, linear

_FLOAT_KINDS = {torch.float32: cpu_kernels.WEIGHT_F32, torch.bfloat16: cpu_kernels.WEIGHT_BF16}


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`quant.linear` with float weights on the kernels too; (T, out) in `out_dtype` (None: x's).
    Where the kernels cannot take it (no compiler, another device or dtype) it is `quant.linear`."""
    if not isinstance(weight, torch.Tensor):
        return linear(x, weight, bias, out_dtype)  # packed weights: on the kernels wherever they are built
    kernels = cpu_kernels.load() if x.device.type == "cpu" else None
    if kernels is None or weight.dtype not in _FLOAT_KINDS or x.dtype not in _FLOAT_KINDS:
        return linear(x, weight, bias, out_dtype)
    return kernels.matmul(x, _FLOAT_KINDS[weight.dtype], weight.contiguous(), None, bias, out_dtype)


# Smaller weights stay on torch: a kernel call costs more fixed time than torch's (tiny test
# models ran a fifth slower), and there is no weight traffic to save.
MIN_KERNEL_ELEMENTS = 1 << 18


def route_linears(model: torch.nn.Module, min_elements: int = MIN_KERNEL_ELEMENTS) -> int:
    """Every `nn.Linear` of a transformers model with at least `min_elements` weights multiplies
    through `invariant_linear` from now on (its `forward` replaced on the instance); returns how
    many. On a CPU the kernels read each weight once for all of a step's rows (torch's float32
    GEMM packs the weight for a few rows: Gemma-3's 262k-row output layer took 3x one row's time
    at 4 rows, the kernel 1.6x). A no-op (0) where the kernels do not run: another device, no
    compiler, or weights they do not take."""
    if cpu_kernels.load() is None:
        return 0
    routed = [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear
        and m.weight.numel() >= min_elements
        and m.weight.device.type == "cpu"
        and m.weight.dtype in _FLOAT_KINDS
    ]
    for module in routed:
        module.forward = _kernel_forward(module)
    return len(routed)


def _kernel_forward(module: torch.nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:  # x (..., in) -> (..., out); other dtypes: torch's
        out = invariant_linear(x.reshape(-1, x.shape[-1]), module.weight, module.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return forward
