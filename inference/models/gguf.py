"""GGUF files: reading and checking the header, and converting tensor by tensor.

Owns: a bounds-checked parser of the GGUF header (magic, version, metadata, tensor table)
that says exactly what is wrong with a damaged file (wrong magic, a header cut short, tensor
data ending past the end of the file), the checks that need nothing but the header (an
architecture transformers can convert, a tokenizer, tensor types that can be dequantized),
and the streaming conversion of the weights into one float32 `model.safetensors` with memory
bounded by the largest tensor.
Must not know: where converted folders live, locking, engine settings, Django.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_MAX_SMALL_ARRAY = 64  # arrays longer than this keep only their length (token lists run to 150k entries)

# GGUF value types: struct format of the scalars; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF file, is damaged, or holds something that cannot be converted."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), as dequantized
    type_id: int
    offset: int  # absolute, from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to keep: its element type and length."""

    type_id: int
    length: int


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    file_size: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    data_end: int  # where the last tensor ends, per the header

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.metadata.get("tokenizer.chat_template"))

    @property
    def vocab_size(self) -> int | None:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            return tokens.length
        return len(tokens) if isinstance(tokens, list) else None

    @property
    def parameter_count(self) -> int:
        count = 0
        for tensor in self.tensors:
            size = 1
            for dim in tensor.shape:
                size *= dim
            count += size
        return count


@dataclass
class _Cursor:
    """Reads little-endian values from the mapped file, never past its end."""

    data: Any  # mmap or bytes
    path: Path
    pos: int = 0
    what: list[str] = field(default_factory=list)

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.take("<Q")
        self._need(length)
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip(self, size: int) -> None:
        self._need(size)
        self.pos += size

    def _need(self, size: int) -> None:
        if self.pos + size > len(self.data):
            where = self.what[-1] if self.what else "the header"
            raise GgufError(
                f"{self.path} is truncated: the header ends at byte {len(self.data):,} while reading {where} "
                f"(needs {size:,} bytes at byte {self.pos:,}); the file was probably not copied completely"
            )


def read_header(path: str | Path) -> GgufHeader:
    """The parsed header of `path`; `GgufError` saying what is wrong if it is not a whole GGUF file."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size == 0:
                raise GgufError(f"{path} is empty (0 bytes), not a GGUF file")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(data, path, size)
    except OSError as error:
        raise GgufError(f"cannot read GGUF file {path}: {error.strerror or error}") from error


def _parse(data: Any, path: Path, size: int) -> GgufHeader:
    magic = bytes(data[:4])
    if magic != GGUF_MAGIC:
        raise GgufError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with {GGUF_MAGIC!r}")
    cursor = _Cursor(data, path, 4, ["the version"])
    version = cursor.take("<I")
    if version not in SUPPORTED_VERSIONS:
        raise GgufError(f"{path} is GGUF version {version}; only versions {SUPPORTED_VERSIONS} can be read")
    cursor.what.append("the counts")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        cursor.what.append(f"metadata entry {index + 1} of {kv_count}")
        key = cursor.string()
        cursor.what.append(f"metadata value {key!r}")
        metadata[key] = _value(cursor, cursor.take("<I"))
    raw_tensors = []
    for index in range(tensor_count):
        cursor.what.append(f"tensor info {index + 1} of {tensor_count}")
        name = cursor.string()
        n_dims = cursor.take("<I")
        dims = [cursor.take("<Q") for _ in range(n_dims)]
        raw_tensors.append((name, tuple(reversed(dims)), cursor.take("<I"), cursor.take("<Q")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GgufError(f"{path}: general.alignment={alignment!r} is not a power of two")
    data_offset = -(-cursor.pos // alignment) * alignment
    tensors = tuple(
        TensorInfo(name, shape, type_id, data_offset + offset, _tensor_bytes(path, name, shape, type_id))
        for name, shape, type_id, offset in raw_tensors
    )
    data_end = max((t.offset + t.nbytes for t in tensors), default=data_offset)
    if data_end > size:
        last = max(tensors, key=lambda t: t.offset + t.nbytes)
        raise GgufError(
            f"{path} is truncated: the header says the tensors end at byte {data_end:,} "
            f"(tensor {last.name!r} included), the file has {size:,} bytes "
            f"({data_end - size:,} missing); the file was probably not copied or downloaded completely"
        )
    return GgufHeader(path, version, size, metadata, tensors, data_offset, data_end)


def _value(cursor: _Cursor, type_id: int) -> Any:
    if type_id in _SCALARS:
        return cursor.take(_SCALARS[type_id])
    if type_id == _STRING:
        return cursor.string()
    if type_id == _ARRAY:
        item_type, length = cursor.take("<I"), cursor.take("<Q")
        if length <= _MAX_SMALL_ARRAY:
            return [_value(cursor, item_type) for _ in range(length)]
        if item_type in _SCALARS:
            cursor.skip(struct.calcsize(_SCALARS[item_type]) * length)
        else:
            for _ in range(length):
                _value(cursor, item_type)
        return ArrayInfo(item_type, length)
    raise GgufError(f"{cursor.path}: unknown metadata value type {type_id} in {cursor.what[-1]}; the file is damaged")


def _tensor_bytes(path: Path, name: str, shape: tuple[int, ...], type_id: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        raise GgufError(f"{path}: tensor {name!r} has unknown tensor type {type_id}; the file is damaged") from None
    elements = 1
    for dim in shape:
        elements *= dim
    if shape and shape[-1] % block_size:
        raise GgufError(f"{path}: tensor {name!r} has {shape[-1]} columns, not a multiple of its block of {block_size}")
    return elements // block_size * type_size


# --- checks that need only the header -------------------------------------------------


def check_convertible(header: GgufHeader) -> None:
    """Everything about converting `header`'s file that can be known without dequantizing:
    an architecture transformers maps, a tokenizer, tensor types that can be dequantized."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path, arch = header.path, header.architecture
    if not arch:
        raise GgufError(f"{path} does not name its architecture (general.architecture)")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GgufError(
            f"{path}: architecture {arch!r} cannot be converted by transformers' GGUF support; "
            f"supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )
    if "tokenizer.ggml.model" not in header.metadata or not header.vocab_size:
        raise GgufError(f"{path} carries no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    unsupported = sorted(
        {t.type_name for t in header.tensors if t.type_id not in {int(q) for q in (*_type_traits, *plain)}}
    )
    if unsupported:
        raise GgufError(f"{path}: tensor types {', '.join(unsupported)} cannot be dequantized by gguf-py")
    if not header.tensors:
        raise GgufError(f"{path} holds no tensors")


# --- streaming conversion ------------------------------------------------------------------

TensorProgress = Callable[[int, int, str], None]  # (done, total, tensor name)


def stream_safetensors(
    header: GgufHeader,
    model_config: Any,
    out_file: Path,
    on_tensor: TensorProgress | None = None,
) -> bool:
    """Write every weight of the GGUF into `out_file` (float32 safetensors), one tensor in
    memory at a time. False (nothing written) when the architecture's tensor processor is one
    that merges or renames tensors across the file (MoE experts): the caller falls back."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    processor_class = TENSOR_PROCESSORS.get(header.architecture or "", TensorProcessor)
    if processor_class not in (TensorProcessor, LlamaTensorProcessor):
        return False
    processor = processor_class(config=model_config.to_dict())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config)
    name_map = get_gguf_hf_weights_map(skeleton, processor)
    expected = set(skeleton.state_dict())
    if getattr(model_config.get_text_config(), "tie_word_embeddings", False):
        expected -= {k for k in expected if k.endswith("lm_head.weight")}
    plan = [(t, name_map[t.name]) for t in header.tensors if t.name in name_map]
    missing = sorted(expected - {hf for _, hf in plan})
    if missing:
        raise GgufError(f"{header.path}: no tensor in the file for {', '.join(missing[:5])}")
    _write_streamed(header, plan, out_file, processor, on_tensor, np, dequantize, GGMLQuantizationType)
    return True


def _write_streamed(
    header: GgufHeader,
    plan: list[tuple[TensorInfo, str]],
    out_file: Path,
    processor: Any,
    on_tensor: TensorProgress | None,
    np: Any,
    dequantize: Any,
    quant_type: Any,
) -> None:
    index, offset = {}, 0
    for tensor, hf_name in plan:
        nbytes = 4 * _count(tensor.shape)
        index[hf_name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    meta = json.dumps({"__metadata__": {"format": "pt"}, **index}, separators=(",", ":")).encode()
    meta += b" " * (-len(meta) % 8)  # safetensors pads the header to 8 bytes
    with header.path.open("rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
        with out_file.open("wb") as out:
            out.write(struct.pack("<Q", len(meta)) + meta)
            for done, (tensor, hf_name) in enumerate(plan, 1):
                raw = np.frombuffer(data, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
                weights = dequantize(_rows(raw, tensor, np, quant_type), quant_type(tensor.type_id))
                weights = processor.process(weights=weights.reshape(tensor.shape), name=tensor.name).weights
                weights = np.ascontiguousarray(weights, dtype=np.float32)
                if weights.shape != tensor.shape:
                    raise GgufError(
                        f"{header.path}: tensor {tensor.name!r} came out {weights.shape}, not {tensor.shape}"
                    )
                out.write(weights.tobytes())
                del weights, raw
                if on_tensor is not None:
                    on_tensor(done, len(plan), hf_name)


def _rows(raw: Any, tensor: TensorInfo, np: Any, quant_type: Any) -> Any:
    """The tensor's bytes shaped as gguf-py's reader shapes them: one row of blocks per row."""
    if tensor.type_id == quant_type.F32:
        return raw.view(np.float32)
    if tensor.type_id == quant_type.F16:
        return raw.view(np.float16)
    rows = _count(tensor.shape[:-1]) if len(tensor.shape) > 1 else 1
    return raw.reshape(rows, -1)


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
