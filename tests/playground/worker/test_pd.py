"""Prefill/decode disaggregation with real (tiny) engines and a real Redis, workers as calls:
the same tokens as colocated, the handoff record, liveness between the workers, and a
clear `kv_handoff_failed` for a blob that is missing, expired or corrupt."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from inference.engine import Engine
from inference.sampling_params import SamplingParams
from playground import dispatch, protocol, task_names
from playground.asgi import application
from playground.coord import cancel, keys, kv_store, liveness, store
from playground.models import Generation
from playground.protocol import CommandError, is_terminal
from playground.worker import generation
from playground.worker import prefill_decode as pd
from tests.inference.engines import engine_for
from tests.playground.conftest import make_generation
from tests.playground.sent_tasks import on_task

pytestmark = pytest.mark.django_db

PROMPT = "The lighthouse keeper climbed the stairs and"
GREEDY = {"greedy": True, "max_new_tokens": 12, "ignore_eos": True, "num_alternatives": 2, "use_prefix_cache": False}
SEEDED = {**GREEDY, "greedy": False, "temperature": 1.2, "seed": 7}
TIMELINE = ("prefill_start", "prefill_end", "handoff_stored", "decode_start", "kv_loaded", "decode_end")


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    """Three "workers" with the same weights: colocated, prefill, decode."""
    return {role: engine_for("llama") for role in ("colocated", "prefill", "decode")}


def queue_completion(owner: str, **params: Any) -> Generation:
    return make_generation(
        owner,
        kind=Generation.Kind.COMPLETE,
        params=SamplingParams(**params).to_dict(),
        inputs={"text": PROMPT, "chat": False, "token_ids": []},
    )


def run_colocated(generation_id: int, engines: dict[str, Engine]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    generation.run_generation(
        generation_id, "gpu-1", load_engine=lambda model: engines["colocated"], send=events.append
    )
    return events


def run_prefill(
    generation_id: int, engines: dict[str, Engine], events: list[dict[str, Any]], **kwargs: Any
) -> list[tuple[int, str]]:
    """The prefill worker's part; returns the decode tasks it enqueued."""
    enqueued: list[tuple[int, str]] = []
    pd.run_prefill(
        generation_id,
        "prefill-1",
        enqueue_decode=lambda *task: enqueued.append(task),
        load_engine=lambda model: engines["prefill"],
        send=events.append,
        **kwargs,
    )
    return enqueued


def run_decode(task: tuple[int, str], engines: dict[str, Engine], events: list[dict[str, Any]], **kwargs: Any) -> None:
    pd.run_decode(*task, "decode-1", load_engine=lambda model: engines["decode"], send=events.append, **kwargs)


def run_disaggregated(
    generation_id: int, engines: dict[str, Engine], before_decode: Callable[[str], None] = lambda blob_key: None
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    [task] = run_prefill(generation_id, engines, events)
    before_decode(task[1])
    run_decode(task, engines, events)
    return events


def steps_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [step for event in events if event["type"] == "generation.tokens" for step in protocol.steps_of(event)]


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def blob_keys() -> list[bytes]:
    return sorted(store.client().scan_iter(match="playground:kv:*"))


# ---- the same tokens, one stream ------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_disaggregated_streams_exactly_the_tokens_of_colocated(
    owner: str, engines: dict[str, Engine], params: dict[str, Any]
) -> None:
    colocated = run_colocated(queue_completion(owner, **params).pk, engines)
    disaggregated = run_disaggregated(queue_completion(owner, **params).pk, engines)

    expected = [step["token_id"] for step in steps_of(colocated)]
    assert [step["token_id"] for step in steps_of(disaggregated)] == expected
    assert len(set(expected)) > 1
    assert [step["index"] for step in steps_of(disaggregated)] == list(range(params["max_new_tokens"]))
    assert disaggregated[-1]["text"] == colocated[-1]["text"]
    assert [is_terminal(event) for event in disaggregated].count(True) == 1


def test_the_stream_has_one_handoff_event_between_the_first_token_and_the_rest(
    owner: str, engines: dict[str, Engine]
) -> None:
    events = run_disaggregated(queue_completion(owner, **GREEDY).pk, engines)

    types = types_of(events)
    assert types[:3] == ["generation.started", "generation.prefilled", "generation.tokens"]
    assert types.count("generation.handoff") == 1 and types[-1] == "generation.finished"
    handoff_at = types.index("generation.handoff")
    assert [step["index"] for step in steps_of(events[:handoff_at])] == [0]  # only the first token before it
    assert events[0]["worker"] == "prefill-1"


def test_the_handoff_is_reported_in_the_event_the_stats_and_the_row(owner: str, engines: dict[str, Engine]) -> None:
    generation = queue_completion(owner, **GREEDY)
    events = run_disaggregated(generation.pk, engines)
    [handoff] = [event for event in events if event["type"] == "generation.handoff"]
    stats = events[-1]["stats"]

    kv_bytes = engines["prefill"].info.kv_bytes_per_token * len(PROMPT)  # one token per byte
    assert (handoff["prefill_worker"], handoff["decode_worker"]) == ("prefill-1", "decode-1")
    assert kv_bytes < handoff["kv_transfer_bytes"] < kv_bytes + 64 * 1024  # the KV cache plus a small header
    for name in ("serialize_ms", "store_ms", "fetch_ms", "load_ms"):
        assert handoff[name] >= 0, name
    assert handoff["transfer_ms"] == pytest.approx(handoff["store_ms"] + handoff["fetch_ms"])
    timeline = [stats["timeline"][name] for name in TIMELINE]
    assert timeline == sorted(timeline)
    assert {name: stats[name] for name in handoff if name not in ("type", "generation_id", "timeline")} == {
        name: handoff[name] for name in handoff if name not in ("type", "generation_id", "timeline")
    }
    assert stats["worker"] == "decode-1" and stats["num_generated_tokens"] == GREEDY["max_new_tokens"]

    generation.refresh_from_db()
    assert (generation.status, generation.prefill_worker, generation.decode_worker) == (
        "finished",
        "prefill-1",
        "decode-1",
    )
    assert generation.stats == stats
    assert [step["index"] for step in generation.steps] == list(range(GREEDY["max_new_tokens"]))
    assert generation.text == events[-1]["text"] and generation.ttft_ms > 0


def test_the_blob_is_stored_with_a_ttl_and_deleted_once_loaded(
    owner: str, settings: Any, engines: dict[str, Engine]
) -> None:
    settings.PLAYGROUND_KV_TTL_S = 90
    generation = queue_completion(owner, **GREEDY)
    events: list[dict[str, Any]] = []
    [task] = run_prefill(generation.pk, engines, events)

    keys = blob_keys()
    assert keys and all(0 < store.client().pttl(key) <= 90_000 for key in keys)
    run_decode(task, engines, events)
    assert blob_keys() == []


def test_a_large_kv_cache_travels_in_chunks(owner: str, engines: dict[str, Engine]) -> None:
    generation = queue_completion(owner, **GREEDY)
    blobs = kv_store.RedisBlobStore(store.client(), ttl_s=60, chunk_bytes=4096)
    events: list[dict[str, Any]] = []
    [task] = run_prefill(generation.pk, engines, events, blobs=blobs)
    assert len(blob_keys()) > 3  # a manifest and several chunks
    run_decode(task, engines, events, blobs=blobs)
    assert events[-1]["type"] == "generation.finished" and blob_keys() == []


def test_requests_that_cannot_be_handed_over_run_whole_on_the_prefill_worker(
    owner: str, engines: dict[str, Engine]
) -> None:
    events: list[dict[str, Any]] = []
    generation = queue_completion(owner, **{**GREEDY, "num_beams": 2, "num_alternatives": 0})
    assert run_prefill(generation.pk, engines, events) == []
    assert types_of(events)[-1] == "generation.finished" and "generation.beams" in types_of(events)
    assert blob_keys() == []


# ---- liveness between the two workers --------------------------------------------------------


def test_a_handed_over_generation_stays_alive_until_its_hold_expires(owner: str, engines: dict[str, Engine]) -> None:
    generation = queue_completion(owner, **GREEDY)
    events: list[dict[str, Any]] = []
    [task] = run_prefill(generation.pk, engines, events)
    Generation.objects.filter(pk=generation.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    generation.refresh_from_db()
    assert not liveness.mark_lost_if_stale(generation)  # waiting for a decode worker is not being lost

    store.client().delete(f"playground:generation:{generation.pk}")  # the hold expired: nobody came
    assert liveness.mark_lost_if_stale(generation)
    run_decode(task, engines, events)  # a decode worker that comes too late does nothing
    assert not any(is_terminal(event) for event in events)
    assert blob_keys() == []


def test_a_decode_task_runs_once(owner: str, engines: dict[str, Engine]) -> None:
    generation = queue_completion(owner, **GREEDY)
    events: list[dict[str, Any]] = []
    [task] = run_prefill(generation.pk, engines, events)
    run_decode(task, engines, events)
    num_events = len(events)
    run_decode(task, engines, events)  # e.g. redelivered by the broker
    assert len(events) == num_events


def test_a_stop_while_waiting_for_the_decode_worker_ends_it_cancelled(owner: str, engines: dict[str, Engine]) -> None:
    generation = queue_completion(owner, **GREEDY)
    events = run_disaggregated(generation.pk, engines, before_decode=lambda key: cancel.request_cancel(generation.pk))
    finished = events[-1]
    assert (finished["type"], finished["finish_reason"]) == ("generation.finished", "cancelled")
    assert finished["stats"]["num_generated_tokens"] == 1
    assert not cancel.is_cancel_requested(generation.pk)


# ---- a blob that cannot be loaded --------------------------------------------------------------


def delete_blob(blob_key: str) -> None:
    pd.blob_store().delete(blob_key)


def corrupt_blob(blob_key: str) -> None:
    blobs = pd.blob_store()
    blob = bytearray(blobs.get(blob_key))
    blob[len(blob) // 2] ^= 0xFF
    blobs.put(blob_key, blob)


def truncate_blob(blob_key: str) -> None:
    blobs = pd.blob_store()
    blobs.put(blob_key, blobs.get(blob_key)[:-100])


@pytest.mark.parametrize(
    "damage, message",
    [
        (delete_blob, "is gone: blob '\\d+' does not exist"),
        (corrupt_blob, "checksum"),
        (truncate_blob, "truncated"),
    ],
)
def test_a_missing_or_broken_blob_ends_with_one_kv_handoff_failed_error(
    owner: str, engines: dict[str, Engine], damage: Callable[[str], None], message: str
) -> None:
    generation = queue_completion(owner, **GREEDY)
    events = run_disaggregated(generation.pk, engines, before_decode=damage)

    error = events[-1]
    assert (error["type"], error["code"]) == ("generation.error", "kv_handoff_failed"), error
    assert re.search(message, error["message"]), error["message"]
    assert [is_terminal(event) for event in events].count(True) == 1
    generation.refresh_from_db()
    assert (generation.status, generation.error_code) == ("error", "kv_handoff_failed")
    assert generation.text == steps_of(events)[0]["text_delta"]  # the first token is kept
    assert blob_keys() == []


def test_an_expired_file_blob_ends_with_kv_handoff_failed(
    owner: str, settings: Any, tmp_path: Path, engines: dict[str, Engine]
) -> None:
    settings.PLAYGROUND_KV_STORE = f"file:{tmp_path}"

    def age_past_ttl(blob_key: str) -> None:
        [path] = tmp_path.glob("*.kv")
        old = path.stat().st_mtime - settings.PLAYGROUND_KV_TTL_S - 1
        os.utime(path, (old, old))

    events = run_disaggregated(queue_completion(owner, **GREEDY).pk, engines, before_decode=age_past_ttl)
    assert (events[-1]["code"], "expired" in events[-1]["message"]) == ("kv_handoff_failed", True)
    assert list(tmp_path.iterdir()) == []


def test_a_file_store_hands_over_like_redis(
    owner: str, settings: Any, tmp_path: Path, engines: dict[str, Engine]
) -> None:
    settings.PLAYGROUND_KV_STORE = f"file:{tmp_path}"
    colocated = run_colocated(queue_completion(owner, **SEEDED).pk, engines)
    disaggregated = run_disaggregated(queue_completion(owner, **SEEDED).pk, engines)
    assert disaggregated[-1]["text"] == colocated[-1]["text"]
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_fails_ends_the_generation_on_the_prefill_worker(
    owner: str, engines: dict[str, Engine], tmp_path: Path
) -> None:
    (tmp_path / "not-a-dir").write_text("")
    blobs = kv_store.FileBlobStore(tmp_path / "not-a-dir", ttl_s=60)
    generation = queue_completion(owner, **GREEDY)
    events: list[dict[str, Any]] = []
    assert run_prefill(generation.pk, engines, events, blobs=blobs) == []
    assert (events[-1]["type"], events[-1]["code"]) == ("generation.error", "kv_handoff_failed")
    assert "could not be stored" in events[-1]["message"]


# ---- which mode, and the tasks --------------------------------------------------------------------


def test_the_pd_field_must_be_a_boolean() -> None:
    assert dispatch.pd_requested({}) is None and dispatch.pd_requested({"pd": True}) is True
    with pytest.raises(CommandError) as refused:
        dispatch.pd_requested({"pd": "yes"})
    assert refused.value.code == "invalid_field"


@pytest.mark.parametrize(
    "mode, pd_requested, task",
    [
        ("colocated", None, "run_generation"),
        ("colocated", True, "run_prefill"),
        ("disaggregated", None, "run_prefill"),
        ("disaggregated", False, "run_generation"),
    ],
)
def test_enqueue_picks_the_queue_from_the_setting_and_the_request(
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    pd_requested: bool | None,
    task: str,
) -> None:
    settings.PLAYGROUND_PD_MODE = mode
    sent: list[tuple[str, int]] = []
    on_task(monkeypatch, "run_prefill", delay=lambda generation_id: sent.append(("run_prefill", generation_id)))
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: sent.append(("run_generation", args[0])))
    dispatch.enqueue(42, pd_requested)
    assert sent == [(task, 42)]


async def connect(session_key: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application,
        "/ws/generate/",
        headers=[
            (b"host", b"localhost"),
            (b"origin", b"http://localhost"),
            (b"cookie", f"sessionid={session_key}".encode()),
        ],
    )
    assert (await ws.connect(timeout=10))[0]
    return ws


@pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the consumer runs in other threads
async def test_a_pd_request_streams_through_the_socket_with_its_handoff_event(
    session_key: str, engines: dict[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    def decode_now(generation_id: int, blob_key: str) -> None:
        pd.run_decode(generation_id, blob_key, "decode-1", load_engine=lambda model: engines["decode"])

    # "Eager" workers: the enqueued tasks run at once, the decode one inside the prefill one.
    on_task(
        monkeypatch,
        "run_prefill",
        delay=lambda generation_id: pd.run_prefill(
            generation_id, "prefill-1", enqueue_decode=decode_now, load_engine=lambda model: engines["prefill"]
        ),
    )
    for queue in ("prefill", "decode"):  # as the two workers announce themselves
        store.client().set(keys.queue_consumer(queue, f"{queue}-1"), 1, ex=60)
    ws = await connect(session_key)
    await ws.send_json_to({"command": "complete", "text": PROMPT, "pd": True, "overrides": GREEDY})
    events = [await ws.receive_json_from(timeout=10)]
    while not is_terminal(events[-1]):
        events.append(await ws.receive_json_from(timeout=10))
    await ws.disconnect()

    assert types_of(events)[:4] == [
        "generation.queued",
        "generation.started",
        "generation.prefilled",
        "generation.tokens",
    ]
    assert "generation.handoff" in types_of(events) and events[-1]["type"] == "generation.finished"
    assert events[-1]["stats"]["decode_worker"] == "decode-1"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_pd_field_that_is_not_a_boolean_is_refused_before_anything_is_written(session_key: str) -> None:
    ws = await connect(session_key)
    await ws.send_json_to({"command": "complete", "text": PROMPT, "pd": "yes"})
    refusal = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert (refusal["type"], refusal["code"]) == ("error", "invalid_field")
    assert not await Generation.objects.aexists()


def test_the_tasks_are_routed_to_their_queues(settings: Any) -> None:
    routes = settings.CELERY_TASK_ROUTES
    assert routes[task_names.RUN_PREFILL] == {"queue": "prefill"}
    assert routes[task_names.RUN_DECODE] == {"queue": "decode"}


# ---- the blob stores ------------------------------------------------------------------------------


@pytest.fixture(params=["redis", "file"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> kv_store.BlobStore:
    if request.param == "redis":
        return kv_store.RedisBlobStore(store.client(), ttl_s=30, chunk_bytes=1000)
    return kv_store.FileBlobStore(tmp_path, ttl_s=30)


def test_a_blob_comes_back_byte_for_byte_and_is_gone_after_delete(blobs: kv_store.BlobStore) -> None:
    blob = os.urandom(4321)
    blobs.put("17", bytearray(blob))
    assert bytes(blobs.get("17")) == blob
    blobs.delete("17")
    with pytest.raises(kv_store.BlobMissing):
        blobs.get("17")
    blobs.delete("17")  # deleting twice is fine


def test_redis_chunks_expire_with_their_manifest() -> None:
    blobs = kv_store.RedisBlobStore(store.client(), ttl_s=30, chunk_bytes=1000)
    blobs.put("9", b"x" * 2500)
    keys = blob_keys()
    assert keys == [b"playground:kv:9", b"playground:kv:9:0", b"playground:kv:9:1", b"playground:kv:9:2"]
    assert all(0 < store.client().pttl(key) <= 30_000 for key in keys)
    store.client().delete(b"playground:kv:9:1")  # one chunk expired first
    with pytest.raises(kv_store.BlobMissing, match="expired while it was being read"):
        blobs.get("9")


def test_the_file_store_sweeps_expired_blobs_when_it_stores_one(tmp_path: Path) -> None:
    blobs = kv_store.FileBlobStore(tmp_path, ttl_s=30)
    blobs.put("old", b"1")
    old = (tmp_path / "old.kv").stat().st_mtime - 31
    os.utime(tmp_path / "old.kv", (old, old))
    blobs.put("new", b"2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.kv"]


@pytest.mark.parametrize("name", ["", "../etc/passwd", "a/b", "kv:*", "x" * 201])
def test_blob_names_are_a_safe_alphabet(blobs: kv_store.BlobStore, name: str) -> None:
    with pytest.raises(ValueError, match="blob name"):
        blobs.put(name, b"1")


@pytest.mark.parametrize("spec", ["", "s3://bucket", "file:", "Redis"])
def test_an_unknown_store_setting_is_a_clear_error(spec: str) -> None:
    with pytest.raises(ValueError, match="PLAYGROUND_KV_STORE"):
        kv_store.open_store(spec, 60, store.client())
