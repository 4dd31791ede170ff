"""A GGUF file's own 4-bit weights as `Int4Weight`s, so the served weights are the file's.

Owns: reading Q4_0 / Q4_1 blocks (32 weights each: an fp16 scale `d`, for Q4_1 an fp16 minimum
`m`, 16 bytes of nibbles: low nibbles are weights 0-15, high nibbles 16-31) and mapping them
onto torch's int4 convention `w = (q - 8) * scale + zero`: Q4_0 is `d * (q - 8)` (zero 0), Q4_1
is `d * q + m` (zero `m + 8 d`). Rows are put in the order transformers uses (llama.cpp stores
Q and K rows permuted for its rotary layout; the same `TensorProcessor` that un-permutes the
dequantized copy gives the row order). Other types (Q8_0, Q4_K, F16 ...) are not read here:
the caller quantizes the converted float copy instead and says so.
Must not know: the engine, requests, where converted folders live.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inference.gguf_file import TensorInfo, read_header
from inference.models.quant import Int4Weight

Q4_0, Q4_1 = 2, 3  # GGML type ids
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20}
NATIVE_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1"}


def native_int4_weights(gguf_path: Path, model: Any, dtype: torch.dtype) -> dict[str, tuple[Int4Weight, str]]:
    """{transformers parameter name (e.g. 'model.layers.0.self_attn.q_proj.weight'): (the file's
    blocks as an Int4Weight, its GGML type name)} for every Q4_0/Q4_1 tensor of the file."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    header = read_header(gguf_path)
    processor = TENSOR_PROCESSORS.get(header.architecture or "", TensorProcessor)(config=model.config.to_dict())
    name_map = _gguf_to_hf_names(header.architecture or "", model)
    found = {}
    with gguf_path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for tensor in header.tensors:
            if tensor.type_id in NATIVE_TYPES and tensor.name in name_map and len(tensor.shape) == 2:
                codes, scale, zero = read_q4_blocks(data, tensor)
                order = _row_order(processor, tensor)
                weight = Int4Weight.from_blocks(codes[order], scale[order].to(dtype), zero[order].to(dtype), 32)
                found[name_map[tensor.name]] = (weight, NATIVE_TYPES[tensor.type_id])
    return found


def _gguf_to_hf_names(architecture: str, model: Any) -> dict[str, str]:
    """{'blk.0.attn_q.weight': 'model.layers.0.self_attn.q_proj.weight', ...} from gguf-py's own
    table, built once (transformers' `get_gguf_hf_weights_map` rebuilds it per module: seconds)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        return {}
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = table.get_name(base)
        if gguf_base:
            names[f"{gguf_base}.{suffix}"] = hf_name
    return names


def read_q4_blocks(data: Any, tensor: TensorInfo) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes (N, K) int32 in 0..15, scale and zero (N, K / 32) float32, in the file's row order."""
    n, k = tensor.shape
    block_bytes = _BLOCK_BYTES[tensor.type_id]
    raw = np.frombuffer(data, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
    blocks = raw.reshape(n, k // 32, block_bytes)  # (N, G, bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, G)
    if tensor.type_id == Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        scale, zero, nibbles = d, m + 8 * d, blocks[..., 4:]
    else:
        scale, zero, nibbles = d, np.zeros_like(d), blocks[..., 2:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(n, k)  # (N, K)
    return torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(scale), torch.from_numpy(zero)


def _row_order(processor: Any, tensor: TensorInfo) -> torch.Tensor:
    """Which file row each transformers row is: the processor applied to the row numbers."""
    rows = np.arange(tensor.shape[0], dtype=np.float64)[:, None]  # (N, 1)
    order = processor.process(weights=rows, name=tensor.name).weights
    return torch.from_numpy(np.asarray(order).reshape(-1).astype(np.int64))
