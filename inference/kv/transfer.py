"""A prefilled request (`Handoff`) as bytes, for a decode worker on another process or machine.

Owns: the blob format and its validation. Must not know: where blobs are stored or how they
travel (see `playground.coord.kv_store`), Django, Celery.

Layout (little-endian):

    magic b"PGKV" | version u16 | header length u32 | sha256 of (header + data), 32 bytes
    | header: UTF-8 JSON | data: the raw tensor bytes, one after the other

The header names the model and describes every tensor (dtype, shape, offset and size in
the data); the request (prompt ids, sampling params, the prefill record, the first token,
seed, TTFT) travels in it as plain JSON. No pickle anywhere: loading a blob only parses JSON
and copies bytes into tensors of allowed dtypes, so a poisoned blob cannot run code. Every
defect (not a blob, another version, truncated, corrupt, a different model or cache
geometry) raises `KVTransferError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from inference.events import Alternative, Prefilled, Step
from inference.kv.paged import LayerKV, layer_kv_nbytes
from inference.sampling_params import SamplingParams
from inference.vision.spans import ImageSpan

MAGIC = b"PGKV"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<4sHI32s")  # magic, version, header length, sha256 digest
# Only these dtypes may be named in a header: a blob cannot make us build anything else.
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "uint8": torch.uint8,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_RNG_STATE = "rng_state"
_HEADER_FIELDS = {"model": str, "num_tokens": int, "tensors": list, "request": dict}


@dataclass
class Handoff:
    """Everything a decode worker needs to continue a request another worker prefilled."""

    prompt_ids: list[int]
    params: SamplingParams
    layers: LayerKV  # the prompt's KV cache, one (keys, values) pair per layer
    prefilled: Prefilled
    first_step: Step
    rng_state: torch.Tensor  # sampler generator state after the first token (seeded runs continue identically)
    seed: int
    ttft_ms: float
    # The prompt's images: their KV is in `layers`; their content hashes key the decode worker's prefix cache.
    image_spans: tuple[ImageSpan, ...] = ()


@dataclass(frozen=True)
class HandedOff:
    """The terminal record of a prefill-only request (`Engine.add_request(prefill_only=True)`):
    its handoff for a decode worker, in place of a `Finished`."""

    handoff: Handoff
    type: str = "handed_off"


class KVTransferError(ValueError):
    """A blob that cannot be loaded: what is wrong with it, in words."""


@dataclass(frozen=True)
class KVSpec:
    """What a KV cache must match to be loaded into a model: the model and the cache's geometry."""

    model: str
    dtype: str
    num_layers: int | None  # None: the config does not say (then the bytes per token still must match)
    kv_bytes_per_token: int

    @classmethod
    def from_model_info(cls, info: dict[str, Any]) -> "KVSpec":
        """From `Engine.model_info()`."""
        return cls(
            model=info["name"],
            dtype=info["dtype"],
            num_layers=info["num_layers"],
            kv_bytes_per_token=info["kv_bytes_per_token"],
        )


# ---- writing ------------------------------------------------------------------------------


def serialize(handoff: Handoff, model: str) -> bytearray:
    """The blob for `handoff`, prefilled by `model` (its name, checked when loading)."""
    tensors = _named_tensors(handoff)
    entries, offset = [], 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(
            {
                "name": name,
                "dtype": _dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        offset += nbytes
    header = json.dumps(
        {
            "model": model,
            "num_tokens": len(handoff.prompt_ids),
            "tensors": entries,
            "data_bytes": offset,
            "request": _request_record(handoff),
        }
    ).encode()
    data_start = _PREAMBLE.size + len(header)
    blob = bytearray(data_start + offset)
    blob[_PREAMBLE.size : data_start] = header
    for (_, tensor), entry in zip(tensors, entries):
        # One copy, straight from the (possibly GPU) tensor into the blob.
        target = torch.frombuffer(blob, dtype=torch.uint8, count=entry["nbytes"], offset=data_start + entry["offset"])
        target.copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
    digest = hashlib.sha256(memoryview(blob)[_PREAMBLE.size :]).digest()
    _PREAMBLE.pack_into(blob, 0, MAGIC, FORMAT_VERSION, len(header), digest)
    return blob


def _named_tensors(handoff: Handoff) -> list[tuple[str, torch.Tensor]]:
    tensors = []
    for i, (keys, values) in enumerate(handoff.layers):
        if keys.shape[1] != len(handoff.prompt_ids) or values.shape[1] != len(handoff.prompt_ids):
            raise ValueError(
                f"layer {i} caches {keys.shape[1]} of {len(handoff.prompt_ids)} prompt tokens "
                "(a sliding-window cache?): only a full KV cache can be handed over"
            )
        tensors += [(f"layers.{i}.keys", keys), (f"layers.{i}.values", values)]
    return tensors + [(_RNG_STATE, handoff.rng_state)]


def _dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"cannot transfer {dtype} tensors; supported: {', '.join(_DTYPES)}")
    return _DTYPE_NAMES[dtype]


def _request_record(handoff: Handoff) -> dict[str, Any]:
    # json's default allow_nan stays on: an infinite logprob would survive, and only we read this JSON.
    return {
        "prompt_ids": handoff.prompt_ids,
        "params": handoff.params.to_dict(),
        "prefilled": handoff.prefilled.to_dict(),
        "first_step": handoff.first_step.to_dict(),
        "seed": handoff.seed,
        "ttft_ms": handoff.ttft_ms,
        "image_spans": [span.to_dict() for span in handoff.image_spans],
    }


# ---- reading ------------------------------------------------------------------------------


def deserialize(
    blob: bytes | bytearray | memoryview, expected: KVSpec | None = None, device: torch.device | str = "cpu"
) -> Handoff:
    """The `Handoff` in `blob`, its KV tensors on `device`; checked against `expected` if given."""
    view = memoryview(blob).cast("B")
    header, data_start = _read_header(view)
    tensors = _read_tensors(view, header, data_start)
    rng_state = tensors.pop(_RNG_STATE, None)
    if rng_state is None or rng_state.dtype != torch.uint8 or rng_state.dim() != 1:
        raise KVTransferError("corrupt KV blob: the sampler's RNG state is missing or malformed")
    layers = _layers(tensors, header["num_tokens"])
    if expected is not None:
        _check_compatible(header["model"], layers, header["num_tokens"], expected)
    handoff = _handoff(header["request"], [(k.to(device), v.to(device)) for k, v in layers], rng_state)
    if len(handoff.prompt_ids) != header["num_tokens"]:
        raise KVTransferError(
            f"corrupt KV blob: {len(handoff.prompt_ids)} prompt ids for {header['num_tokens']} cached tokens"
        )
    return handoff


def _read_header(view: memoryview) -> tuple[dict[str, Any], int]:
    """The parsed header and where the data starts, after checking length and checksum."""
    if len(view) < _PREAMBLE.size:
        raise KVTransferError(f"not a KV blob: {len(view)} bytes is shorter than its fixed preamble")
    magic, version, header_len, digest = _PREAMBLE.unpack_from(view)
    if magic != MAGIC:
        raise KVTransferError(f"not a KV blob: it starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise KVTransferError(
            f"KV blob format version {version} is not supported (this build reads "
            f"version {FORMAT_VERSION}); prefill and decode workers must run the same release"
        )
    data_start = _PREAMBLE.size + header_len
    if data_start > len(view):
        raise KVTransferError(f"truncated KV blob: {len(view)} bytes, but its header alone ends at byte {data_start}")
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : data_start]))
    except ValueError as exc:
        raise KVTransferError(f"corrupt KV blob header: {exc}") from exc
    data_bytes = header.get("data_bytes") if isinstance(header, dict) else None
    if not isinstance(data_bytes, int):
        raise KVTransferError("corrupt KV blob header: it does not say how many data bytes follow")
    if len(view) - data_start != data_bytes:
        what = "truncated" if len(view) - data_start < data_bytes else "oversized"
        raise KVTransferError(f"{what} KV blob: {len(view) - data_start} data bytes, the header says {data_bytes}")
    if hashlib.sha256(view[_PREAMBLE.size :]).digest() != digest:
        raise KVTransferError("corrupt KV blob: its checksum does not match its contents")
    for key, kind in _HEADER_FIELDS.items():
        if not isinstance(header.get(key), kind):
            raise KVTransferError(f"corrupt KV blob header: {key!r} is missing or not a {kind.__name__}")
    return header, data_start


def _read_tensors(view: memoryview, header: dict[str, Any], data_start: int) -> dict[str, torch.Tensor]:
    tensors = {}
    for entry in header["tensors"]:
        try:
            name, dtype, shape = str(entry["name"]), _DTYPES[entry["dtype"]], [int(n) for n in entry["shape"]]
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise KVTransferError(f"corrupt KV blob header: bad tensor entry {entry!r} ({exc})") from exc
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if min(shape, default=1) < 1 or nbytes != math.prod(shape) * itemsize:
            raise KVTransferError(f"corrupt KV blob header: tensor {name} of shape {shape} cannot hold {nbytes} bytes")
        if offset < 0 or offset + nbytes > header["data_bytes"]:
            raise KVTransferError(f"corrupt KV blob header: tensor {name} lies outside the data")
        with warnings.catch_warnings():  # a read-only buffer is fine: the bytes are cloned at once
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(view, dtype=torch.uint8, count=nbytes, offset=data_start + offset)
        tensors[name] = raw.clone().view(dtype).reshape(shape)
    return tensors


def _layers(tensors: dict[str, torch.Tensor], num_tokens: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    num_layers = len(tensors) // 2
    layers = []
    for i in range(num_layers):
        keys, values = tensors.get(f"layers.{i}.keys"), tensors.get(f"layers.{i}.values")
        if keys is None or values is None:
            raise KVTransferError(f"corrupt KV blob: layer {i}'s keys or values are missing")
        for tensor in (keys, values):
            if tensor.dim() != 3 or tensor.shape[1] != num_tokens:
                raise KVTransferError(
                    f"corrupt KV blob: layer {i} has shape {list(tensor.shape)}, expected "
                    f"(kv_heads, {num_tokens}, head_dim)"
                )
        layers.append((keys, values))
    if not layers or len(tensors) != 2 * num_layers:
        raise KVTransferError("corrupt KV blob: its tensors are not (keys, values) pairs, one per layer")
    return layers


def _check_compatible(
    model: Any, layers: list[tuple[torch.Tensor, torch.Tensor]], num_tokens: int, expected: KVSpec
) -> None:
    """Same model, dtype and cache geometry as the engine about to load it."""
    if model != expected.model:
        raise KVTransferError(f"KV blob is from model {model!r}; this worker runs {expected.model!r}")
    dtype = _DTYPE_NAMES[layers[0][0].dtype]
    if dtype != expected.dtype:
        raise KVTransferError(f"KV blob holds {dtype} tensors; this worker's model runs in {expected.dtype}")
    if expected.num_layers is not None and len(layers) != expected.num_layers:
        raise KVTransferError(f"KV blob has {len(layers)} layers; the model has {expected.num_layers}")
    nbytes = layer_kv_nbytes(layers)
    if nbytes != expected.kv_bytes_per_token * num_tokens:
        raise KVTransferError(
            f"KV blob holds {nbytes // num_tokens} bytes per token; this model's cache needs "
            f"{expected.kv_bytes_per_token} (different heads or head size)"
        )


def _handoff(request: Any, layers: list[tuple[torch.Tensor, torch.Tensor]], rng_state: torch.Tensor) -> Handoff:
    try:
        step = dict(request["first_step"])
        step["token_bytes"] = bytes.fromhex(step["token_bytes"])
        for key in ("top_raw", "top_processed", "top_masked"):
            step[key] = tuple(Alternative(**alternative) for alternative in step.get(key, ()))
        return Handoff(
            prompt_ids=[int(i) for i in request["prompt_ids"]],
            params=SamplingParams.from_dict(request["params"]),
            layers=layers,
            prefilled=Prefilled(**request["prefilled"]),
            first_step=Step(**step),
            rng_state=rng_state,
            seed=int(request["seed"]),
            ttft_ms=float(request["ttft_ms"]),
            image_spans=tuple(ImageSpan.from_dict(span) for span in request.get("image_spans", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise KVTransferError(f"corrupt KV blob: its request record is malformed ({exc})") from exc
