"""A GGUF file's tensors as a transformers model's parameters, one piece at a time.

Owns: which parameter each tensor of the file becomes (gguf-py's name table read as transformers'
`get_gguf_hf_weights_map` reads it, built once instead of once per module), and reading each
tensor from the file (plain reads: the file is never mapped, so its pages never count in this
process's memory), dequantized to float32 by gguf-py and put in transformers' layout by the
architecture's `TensorProcessor`:
- in bands of rows (`ROW_BAND_BYTES`) where the processor only reorders rows, which is every 2-D
  weight of Llama, Qwen2, Mistral, Gemma, ... (llama.cpp permutes Q and K rows for its rotary
  layout; the processor applied to the row numbers says where each row goes);
- whole where it does anything else (norms and biases, Gemma's `norm - 1`, GPT-2's transposes);
- through the processor's own side outputs where it merges or splits tensors (MoE experts, GPT-2's
  head), each handed on once the last tensor of the file that writes into it has been read.
Memory: one band, one whole small tensor, or one merged expert tensor at a time; never the model.
Must not know: where the pieces go (a model: `gguf_load`; a safetensors file: `gguf`), dtypes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inference.gguf_file import GgufError, GgufHeader, TensorInfo

# float32 bytes of one band of a weight's rows: gguf-py decodes 1-16 MiB bands at the same speed, but
# each band's copy into the model is a parallel torch op, and with the other core busy (another
# process) a thousand small ones took seconds waiting on their threads' barriers.
ROW_BAND_BYTES = 8 << 20
TensorProgress = Callable[[int, int, str], None]  # (tensors read, tensors to read, parameter name)


@dataclass(frozen=True)
class Piece:
    """Values of one parameter: all of it (`rows` None) or some of its rows, in any order."""

    name: str  # the transformers parameter, e.g. "model.layers.0.self_attn.q_proj.weight"
    values: torch.Tensor  # float32 on the CPU: the parameter's shape, or (len(rows), *its shape[1:])
    rows: slice | np.ndarray | None = None  # which of the parameter's rows `values` holds


class GgufTensors:
    """The tensors of `header`'s file for `model` (its parameters may be on the meta device)."""

    def __init__(self, header: GgufHeader, model: Any) -> None:
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.header = header
        self.processor = TENSOR_PROCESSORS.get(header.architecture or "", TensorProcessor)(
            config=model.config.to_dict()
        )
        self.names = gguf_to_hf_names(header, model, self.processor)
        self.shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
        self._last_reader = _last_readers(header.tensors, self.names)

    def pieces(self, on_tensor: TensorProgress | None = None, skip: frozenset[str] = frozenset()) -> Iterator[Piece]:
        """Every piece of every parameter the file holds, in the file's order, except the weights
        named in `skip` (served from the file's own blocks: never dequantized)."""
        sink: dict[str, Any] = {"tensors": {}}  # where processors put what they merge or split
        plan = []  # (index in the file, tensor, its row order or None to read it whole)
        for index, tensor in enumerate(self.header.tensors):
            order = self._row_order(tensor)
            if order is not None and self.names.get(tensor.name) in skip:
                continue
            if order is None or tensor.name in self.names:  # else: rows that no parameter reads
                plan.append((index, tensor, order))
        with open(self.header.path, "rb", buffering=0) as file:
            for done, (index, tensor, order) in enumerate(plan, 1):
                if order is None:
                    yield from self._whole(file, tensor, sink)
                else:
                    yield from self._bands(file, tensor, order)
                yield from self._finished_side_outputs(sink, index)
                if on_tensor is not None:
                    on_tensor(done, len(plan), self.names.get(tensor.name, tensor.name))
        yield from self._finished_side_outputs(sink, len(self.header.tensors))

    def _bands(self, file: Any, tensor: TensorInfo, order: np.ndarray) -> Iterator[Piece]:
        """A weight whose rows the processor only reorders, read a band of rows at a time."""
        n, k = tensor.shape
        name = self.names[tensor.name]
        if self.shapes.get(name, (n, k)) != (n, k):
            raise GgufError(f"{self.header.path}: {tensor.name} is {(n, k)}, the model's {name} is {self.shapes[name]}")
        row_bytes = tensor.nbytes // n
        band = max(1, ROW_BAND_BYTES // (4 * k))
        is_identity = bool((order == np.arange(n)).all())
        where = None if is_identity else np.argsort(order)  # file row -> parameter row
        for start in range(0, n, band):
            stop = min(n, start + band)
            raw = read_bytes(file, tensor.offset + start * row_bytes, (stop - start) * row_bytes)
            values = _dequantize(raw.reshape(stop - start, row_bytes), tensor)  # (rows, K)
            rows = slice(start, stop) if where is None else where[start:stop]
            yield Piece(name, torch.from_numpy(values), rows)

    def _whole(self, file: Any, tensor: TensorInfo, sink: dict[str, Any]) -> Iterator[Piece]:
        """A tensor the processor changes as a whole (or merges, splits, renames)."""
        raw = read_bytes(file, tensor.offset, tensor.nbytes)
        rows = _count(tensor.shape[:-1]) if len(tensor.shape) > 1 else 1
        values = _dequantize(raw.reshape(rows, -1), tensor).reshape(tensor.shape)
        del raw
        result = self.processor.process(
            weights=values, name=tensor.name, tensor_key_mapping=self.names, parsed_parameters=sink
        )
        if result.name is not None and result.name in self.names:
            values = np.ascontiguousarray(result.weights, dtype=np.float32)
            yield Piece(self.names[result.name], torch.from_numpy(values))

    def _finished_side_outputs(self, sink: dict[str, Any], index: int) -> Iterator[Piece]:
        """The processor's side outputs that no later tensor of the file writes into."""
        for name in [n for n in sink["tensors"] if self._last_reader.get(n, -1) <= index]:
            yield Piece(name, sink["tensors"].pop(name).float().contiguous())

    def _row_order(self, tensor: TensorInfo) -> np.ndarray | None:
        """Which file row each parameter row is, for a 2-D weight whose processor only reorders
        rows (None: it does more, read it whole). The processor is applied to the row numbers,
        in two columns so that a transpose or a column shuffle shows too."""
        if len(tensor.shape) != 2:
            return None
        n = tensor.shape[0]
        probe = np.arange(2 * n, dtype=np.float64).reshape(n, 2)  # (N, 2): row r holds 2r, 2r + 1
        sink: dict[str, Any] = {"tensors": {}}
        try:
            result = self.processor.process(
                weights=probe, name=tensor.name, tensor_key_mapping=self.names, parsed_parameters=sink
            )
            out = np.asarray(result.weights)
        except Exception:  # a processor that needs the real shape: read it whole
            return None
        if sink["tensors"] or result.name != tensor.name or out.shape != (n, 2):
            return None
        order = out[:, 0] / 2
        if not (np.array_equal(out[:, 1], out[:, 0] + 1) and np.array_equal(np.sort(order), np.arange(n))):
            return None
        return order.astype(np.int64)


def gguf_to_hf_names(header: GgufHeader, model: Any, processor: Any) -> dict[str, str]:
    """{'blk.0.attn_q.weight': 'model.layers.0.self_attn.q_proj.weight', ...}: transformers'
    `get_gguf_hf_weights_map` (each parameter name, then the same name without its outer
    modules, the outermost match winning; the processor's renames and fallbacks for merged MoE
    experts), with gguf-py's table built once."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == header.architecture), None)
    if arch is None:
        raise GgufError(f"{header.path}: gguf-py has no tensor names for architecture {header.architecture!r}")
    table = get_tensor_name_map(arch, model.config.get_text_config().num_hidden_layers)
    hf_names = list(model.state_dict())
    names: dict[str, str] = {}
    for depth in range(max((name.count(".") for name in hf_names), default=0)):
        level: dict[str, str] = {}
        for hf_name in hf_names:
            parts = hf_name.split(".")
            if depth >= len(parts) - 1:
                continue
            qual = "".join(f"{part}." for part in parts[:depth])
            local = processor.preprocess_name(".".join(parts[depth:]))
            base, suffix = local.rsplit(".", 1) if local.endswith((".weight", ".bias")) else (local, "")
            suffix = f".{suffix}" if suffix else ""
            gguf_name = table.get_name(base)
            if gguf_name is None:
                processor.perform_fallback_tensor_mapping(level, suffix, qual, local)
            else:
                level[gguf_name + suffix] = qual + local
        names.update({key: value for key, value in level.items() if key not in names})
    return names


def read_bytes(file: Any, offset: int, nbytes: int) -> np.ndarray:
    """`nbytes` of `file` (opened unbuffered) from `offset`, as a writable uint8 array."""
    buffer = bytearray(nbytes)
    view, done = memoryview(buffer), 0
    while done < nbytes:
        count = os.preadv(file.fileno(), [view[done:]], offset + done)
        if count <= 0:
            raise GgufError(f"{file.name} ends at byte {offset + done:,}, inside a tensor: the file is truncated")
        done += count
    return np.frombuffer(buffer, dtype=np.uint8)


def _dequantize(raw: np.ndarray, tensor: TensorInfo) -> np.ndarray:
    """(rows, bytes per row) uint8 -> (rows, columns) float32 (F32 rows: a view of `raw`). A band
    goes to gguf-py's block decoder in one call: its `dequantize` cuts arrays into groups of 16
    rows first, which made a 0.5B model's tensors take 3.3 s instead of 1.8."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits, dequantize

    kind = GGMLQuantizationType(tensor.type_id)
    decoder = _type_traits.get(kind)
    if decoder is None:  # F32, F16: a view, a cast
        return dequantize(raw, kind).astype(np.float32, copy=False)
    decoder.init_grid()  # the IQ types' lookup grids, once
    return decoder.dequantize_rows(raw)


def _last_readers(tensors: tuple[TensorInfo, ...], names: dict[str, str]) -> dict[str, int]:
    """{parameter: index of the last tensor of the file that writes into it} (merged MoE experts
    are written by two: their key in `names` has no '.weight')."""
    last = {}
    for index, tensor in enumerate(tensors):
        for key in (tensor.name, tensor.name.removesuffix(".weight"), tensor.name.removesuffix(".bias")):
            if key in names:
                last[names[key]] = index
    return last


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
