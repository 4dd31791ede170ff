"""Weight precision: which one a model is served in, and putting it into effect.

Owns: the precision names (`auto`, `float32`, `bfloat16`, `float16`, `int8`, `int4`), what `auto`
means on this machine, the activation dtype each implies, and replacing a loaded transformers
model's linear layers by `QuantizedLinear`s for int8 / int4 (taking a GGUF file's own Q4_0 / Q4_1
blocks when it has them, so the served weights are the file's). The embedding table and the
norms stay in the activation dtype: a token reads one embedding row, not the table.
Must not know: requests, the engine, Django.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from inference.config import VALID_DTYPES as PRECISIONS
from inference.models.quant import INT4_GROUP_SIZE, QuantizedLinear, quantize

QUANTIZED_BITS = {"int8": 8, "int4": 4}
# The output layer stays at 8 bits under int4 too (as Q4 GGUF files keep it at 6-8): its errors
# land directly in the next-token distribution.
HEAD_BITS = 8
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX): then bfloat16 prefill
    is about 3x faster than float32 and decode reads half the bytes (measured by inference.bench)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` -> bfloat16 on CUDA (float16 without bf16 support) and on CPUs with bf16 units,
    float32 on other CPUs. Any other name is returned as it is (after checking it)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16() else "float32"


def activation_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype activations (and unquantized weights) run in. Quantized weights are read by
    kernels that take bfloat16 activations (float16 on GPUs without bf16)."""
    if precision in FLOAT_DTYPES:
        return FLOAT_DTYPES[precision]
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def load_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype to load weights in: quantizing on a CPU starts from float32 (codes chosen from the
    exact weights); on a GPU from the activation dtype (memory)."""
    if precision in QUANTIZED_BITS and device.type == "cpu":
        return torch.float32
    return activation_dtype(precision, device)


@dataclass(frozen=True)
class QuantizationReport:
    """What `quantize_model` did, shown with the model."""

    precision: str
    num_quantized: int  # linear layers now read packed low-bit weights
    num_from_file: int  # of them, the GGUF file's own blocks (not a re-quantization)
    file_types: tuple[str, ...]  # their GGML types, e.g. ("Q4_1",)
    num_kept: int  # linear layers left in the activation dtype (a shape the kernel cannot take)
    head_bits: int  # the output layer's bits (int4 keeps it at 8, as Q4 GGUF files keep it at 6-8)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantize_model(model: Any, precision: str, dtype: torch.dtype, gguf_path: Path | None = None) -> QuantizationReport:
    """Replace every `nn.Linear` (attention, MLP, output head) by a `QuantizedLinear` in place,
    then cast the remaining parameters to `dtype`."""
    from inference.models.gguf_blocks import native_int4_weights

    bits = QUANTIZED_BITS[precision]
    device = next(model.parameters()).device
    if device.type != "cpu" and bits == 4:
        raise ValueError("precision='int4' runs on the CPU kernel only: use 'int8' or 'bfloat16' on a GPU")
    if device.type != "cpu" and not _int8_kernel_works(device, dtype):
        raise ValueError(f"precision='int8': torch {torch.__version__} has no int8 weight kernel for {device}")
    from_file = native_int4_weights(gguf_path, model, dtype) if bits == 4 and gguf_path else {}
    head = model.get_output_embeddings()
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    if all(module is head for _, module in linears):
        raise ValueError(f"the model has no linear layer the {precision} kernel can take (e.g. GPT-2's Conv1D)")
    num_quantized, used, num_kept = 0, [], 0
    for name, module in linears:
        layer_bits = HEAD_BITS if module is head else bits
        if not _fits_kernel(module, layer_bits):
            num_kept += 1
            continue
        native = from_file.get(f"{name}.weight") if layer_bits == 4 else None
        if native is not None:
            weight, source = native[0], f"gguf:{native[1]}"
            used.append(native[1])
        else:
            weight, source = quantize(module.weight, layer_bits, dtype), "quantized"
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        model.set_submodule(name, QuantizedLinear(weight, bias, source))
        num_quantized += 1
    for param in model.parameters():  # embeddings, norms, biases left in float
        param.data = param.data.to(dtype)
    return QuantizationReport(precision, num_quantized, len(used), tuple(sorted(set(used))), num_kept, HEAD_BITS)


def _int8_kernel_works(device: torch.device, dtype: torch.dtype) -> bool:
    weight = quantize(torch.randn(64, 64), 8, dtype)
    x = torch.randn(2, 64, dtype=dtype)
    try:
        out = torch._weight_int8pack_mm(x.to(device), weight.codes.to(device), weight.scales.to(device))
    except (NotImplementedError, RuntimeError):
        return False
    return torch.allclose(out.float().cpu(), (x.float() @ weight.dequantize().t()), rtol=0.05, atol=0.05)


def _fits_kernel(module: torch.nn.Linear, bits: int) -> bool:
    if bits == 4:
        return module.in_features % INT4_GROUP_SIZE == 0 and module.out_features % 8 == 0
    return True


def weight_stats(model: Any) -> tuple[int, int]:
    """(number of weights, bytes they take as served): a packed int4 weight counts its 2 per byte."""
    num_params = sum(p.numel() for p in model.parameters())
    num_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            num_params += module.in_features * module.out_features
            num_bytes += module.qweight.nbytes
    return num_params, num_bytes


def decode_read_bytes(model: Any) -> int:
    """Weight bytes one decode step reads: every weight once, except the embedding table, of which a
    token reads one row (unless the output layer is that same table, tied, and reads it all)."""
    _, num_bytes = weight_stats(model)
    table = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and head.weight is table:
        return num_bytes
    return num_bytes - table.numel() * table.element_size() + table.shape[1] * table.element_size()
