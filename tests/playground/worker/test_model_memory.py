"""Memory that comes back (issue 46, part 3): a model the worker switches away from is freed
(its engine loop's threads held it for the life of the process) and the freed heap is returned
to the OS after every unload, after a test load, after a precision comparison is replaced, and
once the batch is idle after long prompts. `release_free_memory` is recorded, not run."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

import inference.models.memory
from inference.engine import Engine
from inference.events import Finished
from playground.models import LanguageModel, LoadReportStatus
from playground.worker import engines, memory_release, model_state
from playground.worker.load_report import run_test_load
from playground.worker.memory_release import ReleaseAfterLongPrompts
from tests.playground.fake_engine import FakeEngine

from .test_model_test_load import save_tiny_folder

pytestmark = pytest.mark.django_db


class Releases:
    """Stands in for `release_free_memory`: each call records whether `watched` was gone by then."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.watched: weakref.ref | None = None

    def __call__(self) -> bool:
        self.calls.append(self.watched is not None and self.watched() is None)
        return True


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> Releases:
    recorder = Releases()
    monkeypatch.setattr(inference.models.memory, "release_free_memory", recorder)
    monkeypatch.setattr(memory_release, "release_free_memory", recorder)
    return recorder


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Engine, "load", lambda config, progress=None: FakeEngine())
    monkeypatch.setattr(engines, "_loaded", None)
    monkeypatch.setattr(engines, "_comparison", None)
    monkeypatch.setattr(model_state, "_record", None)
    yield
    for loop in list(engines._loops.values()):
        loop.close()
    engines._loops.clear()
    model_state._record = None


def loop_threads() -> int:
    return sum(t.name in ("engine-loop", "cancel-watch") for t in threading.enumerate())


def test_a_model_switched_away_from_is_freed_before_the_next_load(fake_engines, releases: Releases) -> None:
    first, second = LanguageModel.objects.filter(source__startswith="bundled")[:2]
    threads_before = loop_threads()
    engine = engines.get_engine(first)
    engines.loop_for(engine)  # a generation ran on it: its loop's threads started
    releases.watched = weakref.ref(engine)
    del engine
    releases.calls.clear()

    engines.get_engine(second)

    gc.collect()
    assert releases.watched() is None  # before: the old loop's threads kept the engine for ever
    assert releases.calls[0] is True  # released once the old engine was gone, before the next load
    assert len(releases.calls) >= 2  # and after the load (its temporaries)
    assert loop_threads() == threads_before


def test_a_replaced_comparison_model_is_freed_and_released(
    fake_engines, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Loaded:  # stands in for a LoadedModel
        pass

    monkeypatch.setattr("inference.models.loader.load_model", lambda config: Loaded())
    model = LanguageModel.objects.get(source="bundled")
    releases.watched = weakref.ref(engines.comparison_model(model, "int8"))
    releases.calls.clear()
    engines.comparison_model(model, "int4")
    assert releases.calls and releases.calls[0] is True


def test_a_test_load_gives_its_engine_back(
    releases: Releases, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PLAYGROUND_DATA_DIR, settings.PLAYGROUND_DEVICE = tmp_path, "cpu"
    save_tiny_folder(tmp_path / "tiny")
    model = LanguageModel.objects.create(name="mine", source="./tiny", dtype="float32")
    load = Engine.load

    def watched_load(config, progress=None):
        engine = load(config, progress)
        releases.watched = weakref.ref(engine)
        return engine

    monkeypatch.setattr(Engine, "load", watched_load)
    run_test_load(model.pk, worker="w1")
    model.refresh_from_db()
    assert model.test_load_status == LoadReportStatus.OK, model.test_load_error
    assert releases.calls and releases.calls[-1] is True  # after the test's engine was freed


def finished(num_prompt_tokens: int) -> Finished:
    return Finished("length", "", (), num_prompt_tokens, 0, 1, 0.0, 0.0, 0.0, 0.0, 0)


def test_long_prompts_release_memory_once_the_batch_is_idle(releases: Releases) -> None:
    observer = ReleaseAfterLongPrompts(long_prompt_tokens=1000)
    observer.on_event(1, finished(600))
    observer.after_step(None, None, {}, num_requests=0)
    assert releases.calls == []  # short prompts: nothing to give back
    observer.on_event(2, finished(600))  # 1,200 prompt tokens since the last release
    observer.after_step(None, None, {}, num_requests=1)
    assert releases.calls == []  # not while a request still runs
    observer.after_step(None, None, {}, num_requests=0)
    observer.after_step(None, None, {}, num_requests=0)
    assert len(releases.calls) == 1  # once, then the count starts again


def test_the_worker_loop_releases_after_long_prompts(fake_engines) -> None:
    loop = engines.loop_for(engines.get_engine(LanguageModel.objects.get(source="bundled")))
    assert isinstance(loop.observer, ReleaseAfterLongPrompts)
    assert type(loop.observer.inner).__name__ == "WorkerObserver"  # the reports go on as before
