"""The KV handoff blob: a round trip continues a request token for token, and every broken,
forged or mismatched blob is refused with a `KVTransferError` that says what is wrong."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace

import pytest
import torch

from inference import SamplingParams, Step
from inference.engine import Engine
from inference.kv.transfer import FORMAT_VERSION, MAGIC, Handoff, KVSpec, KVTransferError, deserialize, serialize
from tests.inference.engines import engine_for

PROMPT_IDS = list(range(40, 70))
GREEDY = SamplingParams(greedy=True, max_new_tokens=12, ignore_eos=True, num_alternatives=3, use_prefix_cache=False)
SEEDED = SamplingParams(
    temperature=1.3, top_k=40, seed=1234, max_new_tokens=12, ignore_eos=True, num_alternatives=3, use_prefix_cache=False
)
PREAMBLE = struct.Struct("<4sHI32s")


@pytest.fixture(scope="module")
def llama() -> Engine:
    return engine_for("llama")


def token_ids(engine: Engine, params: SamplingParams, handoff: Handoff | None = None) -> list[int]:
    return [e.token_id for e in engine.generate(PROMPT_IDS, params, handoff=handoff) if isinstance(e, Step)]


def spec_of(engine: Engine) -> KVSpec:
    return KVSpec.from_model_info(engine.model_info())


def forge(header: dict, data: bytes = b"") -> bytes:
    """A blob with a valid checksum around whatever header and data we like (an attacker's view)."""
    header_bytes = json.dumps(header).encode()
    digest = hashlib.sha256(header_bytes + data).digest()
    return PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header_bytes), digest) + header_bytes + data


def header_of(blob: bytes | bytearray) -> tuple[dict, bytes]:
    _, _, header_len, _ = PREAMBLE.unpack_from(blob)
    start = PREAMBLE.size + header_len
    return json.loads(bytes(blob[PREAMBLE.size : start])), bytes(blob[start:])


# ---- the round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2", "deepseek_v3"])  # lean runner, HF cache, MLA (k != v shapes)
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_loaded_blob_continues_with_exactly_the_tokens_of_an_uninterrupted_run(
    arch: str, params: SamplingParams
) -> None:
    prefill_engine, decode_engine = engine_for(arch), engine_for(arch)  # two "workers", same weights
    expected = token_ids(prefill_engine, params)

    handoff = prefill_engine.prefill_for_handoff(PROMPT_IDS, params)
    blob = bytes(serialize(handoff, prefill_engine.loaded.name))
    loaded = deserialize(blob, spec_of(decode_engine))

    assert token_ids(decode_engine, params, loaded) == expected
    assert len(set(expected)) > 1  # a real sequence, not one token repeated


def test_the_request_record_survives_the_round_trip_unchanged(llama: Engine) -> None:
    handoff = llama.prefill_for_handoff(PROMPT_IDS, SEEDED)
    loaded = deserialize(serialize(handoff, llama.loaded.name), spec_of(llama))

    assert (loaded.prompt_ids, loaded.params, loaded.seed, loaded.ttft_ms) == (
        handoff.prompt_ids,
        handoff.params,
        handoff.seed,
        handoff.ttft_ms,
    )
    assert loaded.prefilled == handoff.prefilled
    assert loaded.first_step == handoff.first_step
    assert torch.equal(loaded.rng_state, handoff.rng_state)
    for (k, v), (k2, v2) in zip(loaded.layers, handoff.layers):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_an_unseeded_request_continues_from_the_seed_the_prefill_worker_drew(llama: Engine) -> None:
    params = replace(SEEDED, seed=None)
    handoff = llama.prefill_for_handoff(PROMPT_IDS, params)
    loaded = deserialize(serialize(handoff, llama.loaded.name), spec_of(llama))
    expected = token_ids(llama, replace(params, seed=handoff.seed))
    assert token_ids(llama, params, loaded) == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tensors_travel_bit_exact(llama: Engine, dtype: torch.dtype) -> None:
    handoff = llama.prefill_for_handoff(PROMPT_IDS, GREEDY)
    handoff = replace(handoff, layers=[(k.to(dtype), v.to(dtype)) for k, v in handoff.layers])
    loaded = deserialize(serialize(handoff, "m"))
    for (k, v), (k2, v2) in zip(loaded.layers, handoff.layers):
        assert k.dtype == dtype and torch.equal(k, k2) and torch.equal(v, v2)


def test_a_partial_cache_cannot_be_handed_over(llama: Engine) -> None:
    handoff = llama.prefill_for_handoff(PROMPT_IDS, GREEDY)
    windowed = replace(handoff, layers=[(k[:, -8:], v[:, -8:]) for k, v in handoff.layers])
    with pytest.raises(ValueError, match="only a full KV cache can be handed over"):
        serialize(windowed, "m")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_blob_goes_from_gpu_tensors_to_gpu_tensors(llama: Engine) -> None:
    handoff = llama.prefill_for_handoff(PROMPT_IDS, GREEDY)
    on_gpu = replace(handoff, layers=[(k.cuda(), v.cuda()) for k, v in handoff.layers])
    loaded = deserialize(serialize(on_gpu, "m"), device="cuda")
    assert loaded.layers[0][0].is_cuda
    assert torch.equal(loaded.layers[0][0].cpu(), handoff.layers[0][0])


# ---- refusals --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def blob(llama: Engine) -> bytes:
    return bytes(serialize(llama.prefill_for_handoff(PROMPT_IDS, GREEDY), llama.loaded.name))


@pytest.mark.parametrize("keep", [0, 10, PREAMBLE.size + 5, -1000, -1])
def test_a_truncated_blob_is_refused(blob: bytes, keep: int) -> None:
    with pytest.raises(KVTransferError, match="truncated|shorter|not a KV blob|corrupt"):
        deserialize(blob[:keep])


def test_a_blob_with_trailing_bytes_is_refused(blob: bytes) -> None:
    with pytest.raises(KVTransferError, match="oversized"):
        deserialize(blob + b"\0")


@pytest.mark.parametrize("where", ["header", "data"])
def test_a_flipped_bit_is_caught_by_the_checksum(blob: bytes, where: str) -> None:
    header, data = header_of(blob)
    position = PREAMBLE.size + (5 if where == "header" else len(blob) - len(data) + len(data) // 2)
    corrupted = bytearray(blob)
    corrupted[position] ^= 0x01
    with pytest.raises(KVTransferError, match="checksum|corrupt"):
        deserialize(bytes(corrupted))


def test_something_that_is_not_a_blob_is_refused() -> None:
    with pytest.raises(KVTransferError, match="not a KV blob"):
        deserialize(b"\x80\x04\x95" + b"\0" * 100)  # a pickle's opening bytes


def test_a_blob_of_another_format_version_is_refused(blob: bytes) -> None:
    newer = bytearray(blob)
    struct.pack_into("<H", newer, 4, FORMAT_VERSION + 1)
    with pytest.raises(KVTransferError, match=f"version {FORMAT_VERSION + 1} is not supported"):
        deserialize(bytes(newer))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": "another-model"}, "from model 'tiny-llama'; this worker runs 'another-model'"),
        ({"dtype": "bfloat16"}, "holds float32 tensors"),
        ({"num_layers": 5}, "has 2 layers; the model has 5"),
        ({"kv_bytes_per_token": 64}, "bytes per token"),
    ],
)
def test_a_blob_for_another_model_or_cache_geometry_is_refused(
    llama: Engine, blob: bytes, change: dict, message: str
) -> None:
    with pytest.raises(KVTransferError, match=message):
        deserialize(blob, replace(spec_of(llama), **change))


def test_kv_transfer_errors_are_value_errors() -> None:
    assert issubclass(KVTransferError, ValueError)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h: h["tensors"][0].update(dtype="object"), "bad tensor entry"),
        (lambda h: h["tensors"][0].update(offset=10**9), "outside the data"),
        (lambda h: h["tensors"][0].update(shape=[1000, 1000, 1000]), "cannot hold"),
        (lambda h: h["tensors"][0].update(shape=[0, 30, 8]), "cannot hold"),
        (lambda h: h["tensors"].pop(0), "missing|pairs"),
        (lambda h: h["tensors"].pop(), "RNG state"),
        (lambda h: h.update(num_tokens=7), "expected \\(kv_heads, 7, head_dim\\)"),
        (lambda h: h.pop("request"), "'request' is missing"),
        (lambda h: h["request"]["params"].update(temperature=-1), "request record is malformed"),
        (lambda h: h["request"]["first_step"].update(evil="__import__('os')"), "request record is malformed"),
        (lambda h: h["request"].update(prompt_ids=[1, 2]), "2 prompt ids for 30 cached tokens"),
    ],
)
def test_a_forged_header_with_a_valid_checksum_is_refused(blob: bytes, mutate, message: str) -> None:
    header, data = header_of(blob)
    mutate(header)
    with pytest.raises(KVTransferError, match=message):
        deserialize(forge(header, data))


def test_a_header_that_is_not_json_is_refused() -> None:
    header = b"{not json"
    digest = hashlib.sha256(header).digest()
    with pytest.raises(KVTransferError, match="corrupt KV blob header"):
        deserialize(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header), digest) + header)
