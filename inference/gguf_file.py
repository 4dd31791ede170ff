"""The GGUF file format's header: read and checked without torch or transformers.

Owns: a bounds-checked parser of the header (magic, version, metadata, tensor table) that
says exactly what is wrong with a damaged file: wrong magic, an unsupported version, a header
cut short (and while reading what), tensor data ending past the end of the file. Reads only
the header (the file is memory-mapped; weights are never touched), so the web process can run
it on an admin's source. Must not know: conversion, torch, transformers, Django.
"""

from __future__ import annotations

import mmap
import struct
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
_LENGTH = struct.Struct("<Q")


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
        elif item_type == _STRING:
            _skip_strings(cursor, length)
        else:
            for _ in range(length):
                _value(cursor, item_type)
        return ArrayInfo(item_type, length)
    raise GgufError(f"{cursor.path}: unknown metadata value type {type_id} in {cursor.what[-1]}; the file is damaged")


def _skip_strings(cursor: _Cursor, count: int) -> None:
    """Steps over `count` strings without decoding them: a vocabulary's 150k tokens took a
    second through `_value`, and every load reads the header."""
    data, pos, end = cursor.data, cursor.pos, len(cursor.data)
    read_length = _LENGTH.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            break
        (length,) = read_length(data, pos)
        if pos + 8 + length > end:
            break
        pos += 8 + length
    else:
        cursor.pos = pos
        return
    cursor.pos = pos
    cursor.string()  # the string that does not fit: raises, saying where


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
