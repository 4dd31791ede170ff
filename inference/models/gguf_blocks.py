"""A GGUF file's weights as the file stores them: each tensor's type, and the 4-bit ones as
`Int4Weight`s, so the served weights are the file's.

Owns: which GGML type each transformers weight has in the file (`file_weights`), and reading
4-bit blocks and mapping them onto torch's int4 convention
`w = (q - 8) * scale + zero` in groups of 32, exactly:
- Q4_0 / Q4_1: 32 weights per block, an fp16 scale `d` (Q4_1: and minimum `m`), 16 bytes of
  nibbles (low nibbles weights 0-15, high 16-31). Q4_0 is `d * (q - 8)` (zero 0), Q4_1 is
  `d * q + m` (zero `m + 8 d`).
- Q4_K (the 4-bit tensors of Q4_K_S/M files): super-blocks of 256 with fp16 `d` and `dmin`,
  and per group of 32 a 6-bit scale `sc` and minimum `mn`: `d sc * q - dmin mn`, so
  scale `d sc`, zero `8 d sc - dmin mn` (gguf-py unpacks the 6-bit fields).
Rows are put in the order transformers uses (llama.cpp stores Q and K rows permuted for its
rotary layout; the same `TensorProcessor` that un-permutes the dequantized copy gives the row
order). Other types (Q5_0, Q6_K, Q8_0, F16 ...) have no exact int4 form: their type is reported
and the caller serves the converted float copy (the file's exact values) in a form at least as
precise (see `precision.quantize_model`).
Must not know: the engine, requests, where converted folders live.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inference.gguf_file import TensorInfo, read_header
from inference.models.quant import BLOCK_TYPES, BlockWeight, Int4Weight

Q4_0, Q4_1, Q4_K = 2, 3, 12  # GGML type ids
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20}
NATIVE_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q4_K: "Q4_K"}
QK_K, Q4_K_BYTES = 256, 144  # a Q4_K super-block: 2 + 2 (d, dmin) + 12 (6-bit scales, mins) + 128 (nibbles)


@dataclass(frozen=True)
class FileWeight:
    """One 2-D weight of the file: its GGML type ("Q4_K", "Q6_K", "F16", ...) and, when asked for,
    the file's own blocks: as an `Int4Weight` for the 4-bit types above, as a `BlockWeight` (its
    bytes, rows in transformers' order) for every type `quant.BLOCK_TYPES` names."""

    type_name: str
    int4: Int4Weight | None = None
    blocks: BlockWeight | None = None


def file_weights(
    gguf_path: Path, model: Any, dtype: torch.dtype, read_int4: bool = True, read_blocks: bool = False
) -> dict[str, FileWeight]:
    """{transformers parameter name (e.g. 'model.layers.0.self_attn.q_proj.weight'): what the
    file holds for it} for every 2-D tensor of the file; Q4_0/Q4_1/Q4_K tensors come with their
    blocks as an Int4Weight when `read_int4`, every block type as a BlockWeight when `read_blocks`."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    header = read_header(gguf_path)
    processor = TENSOR_PROCESSORS.get(header.architecture or "", TensorProcessor)(config=model.config.to_dict())
    name_map = _gguf_to_hf_names(header.architecture or "", model)
    found = {}
    with gguf_path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for tensor in header.tensors:
            if tensor.name not in name_map or len(tensor.shape) != 2:
                continue
            weight = blocks = None
            if read_int4 and tensor.type_id in NATIVE_TYPES:
                codes, scale, zero = read_q4_blocks(data, tensor)
                order = _row_order(processor, tensor)
                weight = Int4Weight.from_blocks(codes[order], scale[order].to(dtype), zero[order].to(dtype), 32)
            if read_blocks and tensor.type_id in BLOCK_TYPES:
                blocks = read_block_rows(file, tensor, _row_order(processor, tensor))
            found[name_map[tensor.name]] = FileWeight(tensor.type_name, weight, blocks)
    return found


def native_int4_weights(gguf_path: Path, model: Any, dtype: torch.dtype) -> dict[str, tuple[Int4Weight, str]]:
    """{transformers parameter name: (the file's blocks as an Int4Weight, its GGML type name)}
    for every Q4_0/Q4_1/Q4_K tensor of the file."""
    return {
        name: (weight.int4, weight.type_name)
        for name, weight in file_weights(gguf_path, model, dtype).items()
        if weight.int4 is not None
    }


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
    if tensor.type_id == Q4_K:
        return read_q4_k_blocks(data, tensor)
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


def read_q4_k_blocks(data: Any, tensor: TensorInfo) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`read_q4_blocks` for Q4_K: its eight groups of 32 per super-block, each with its own scale
    and zero."""
    from gguf import quants

    n, k = tensor.shape
    raw = np.frombuffer(data, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
    blocks = raw.reshape(n, k // QK_K, Q4_K_BYTES)  # (N, S, bytes)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # (N, S, 1)
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))  # (N * S, 8) each
    scale = d * sc.reshape(n, -1, 8).astype(np.float32)  # (N, S, 8): one per group of 32
    minimum = dmin * mn.reshape(n, -1, 8).astype(np.float32)
    # 32 bytes per pair of groups: group 2i in the low nibbles, group 2i + 1 in the high ones.
    nibbles = blocks[..., 16:].reshape(n, -1, 4, 1, 32)  # (N, S, pair, 1, 32)
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(n, k)  # (N, K)
    scale, zero = scale.reshape(n, -1), (8 * scale - minimum).reshape(n, -1)  # (N, K / 32)
    return torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(scale), torch.from_numpy(zero)


def read_block_rows(file: Any, tensor: TensorInfo, order: torch.Tensor) -> BlockWeight:
    """The tensor's bytes, row n of the result being transformers' row n (file row order[n]). Read,
    not mapped: a mapped file's pages would count in the process's memory besides the copy."""
    n, k = tensor.shape
    data = bytearray(tensor.nbytes)
    if os.preadv(file.fileno(), [data], tensor.offset) != tensor.nbytes:
        raise ValueError(f"{tensor.name}: the file ends before its {tensor.nbytes} bytes")
    rows = np.frombuffer(data, dtype=np.uint8).reshape(n, -1)  # (N, row bytes)
    if not torch.equal(order, torch.arange(n)):
        rows = rows[order.numpy()]
    return BlockWeight(torch.from_numpy(rows), tensor.type_id, k)


def _row_order(processor: Any, tensor: TensorInfo) -> torch.Tensor:
    """Which file row each transformers row is: the processor applied to the row numbers."""
    rows = np.arange(tensor.shape[0], dtype=np.float64)[:, None]  # (N, 1)
    order = processor.process(weights=rows, name=tensor.name).weights
    return torch.from_numpy(np.asarray(order).reshape(-1).astype(np.int64))
