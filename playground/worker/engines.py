"""The loaded engine of this worker process and the loop that steps it: one model at a time,
shared by every generation the process runs at once; the default model is loaded when the worker
starts (`preload_default_model`), any other on first use.

Owns: the model cache keyed by (record id, engine settings), so a changed admin record loads
anew; a switch to another model waits until the current one's requests have finished, then
frees its memory before loading the next; every load announced ("loading", then "ready" with its
time, or "error": `model_state`) and when it finished (`loaded_at`: a generation created before
that, queued while the worker loaded or waiting in its task, counts the wait in its time to first
token); memory given back: a dropped model's loop threads end (they held its engine), and the
freed heap goes back to the OS (`release_free_memory`) after every unload and every load.
`inference.engine` (torch) is imported only when a model is first loaded, so importing this
module stays cheap.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.conf import settings

from playground.coord import cancel
from playground.models import LanguageModel
from playground.worker import model_state
from playground.worker.memory_release import ReleaseAfterLongPrompts
from playground.worker.observer import WorkerObserver
from playground.worker.serve_loop import ServeLoop

if TYPE_CHECKING:
    from inference.engine import Engine

logger = logging.getLogger(__name__)

SWITCH_TIMEOUT_S = 600.0  # how long a request for another model waits for the current one's to finish

_lock = threading.Lock()
_draft_lock = threading.Lock()  # one draft load at a time (two requests naming one draft load it once)
_loaded: tuple[tuple[Any, ...], Engine] | None = None
_loops: dict[int, ServeLoop] = {}  # id(engine) -> its loop
_comparison: tuple[tuple[Any, ...], Any] | None = None  # (key, LoadedModel): one at a time
_refused_drafts: dict[tuple[Any, ...], str] = {}  # (id(engine), model, draft record, its version) -> why
_loaded_at: dict[int, float] = {}  # id(engine) -> when its load finished (time.time(): generations compare it)


def get_engine(model: LanguageModel) -> Engine:
    """The engine for `model`, loading it (and dropping the previous one, and a precision
    comparison of another model) when needed."""
    global _loaded, _comparison
    config = replace(
        model.to_engine_config(),
        max_num_seqs=settings.PLAYGROUND_WORKER_SLOTS,
        kv_cache_bytes=settings.PLAYGROUND_KV_CACHE_MB * 1024 * 1024,
        max_num_batched_tokens=settings.PLAYGROUND_MAX_BATCHED_TOKENS,
        max_step_ms=settings.PLAYGROUND_MAX_STEP_MS or None,
    )
    key = (model.pk, config)
    with _lock:
        if _loaded is not None and _loaded[0] == key:
            return _loaded[1]
        if _loaded is not None:
            _wait_until_idle(_loaded[1])
            _close_loop(_loaded[1])
        if _comparison is not None and _comparison[0][0] != model.pk:  # only that model's inspections read it
            _comparison = None
        _loaded = None
        _loaded_at.clear()
        _give_back_memory()  # the previous model's, before the next one's load needs it
        from inference.engine import Engine

        logger.info("loading model %r (%s)", model.name, config)
        model_state.loading(model.pk, model.name)
        started = time.monotonic()
        try:
            engine = Engine.load(config, progress=lambda message: logger.info("%s: %s", model.name, message))
        except Exception as exc:
            model_state.failed(model.pk, model.name, f"{type(exc).__name__}: {exc}")
            raise
        _give_back_memory()  # the load's temporaries (the runner's fused copies replaced the weights)
        _loaded_at[id(engine)] = time.time()
        model_state.ready(model.pk, model.name, (time.monotonic() - started) * 1000)
        _loaded = (key, engine)
        return engine


def attach_draft(engine: Engine, model: LanguageModel, speculative: str) -> None:
    """Loads the model named `speculative` as `engine`'s draft (speculative decoding), once; a
    ValueError naming `speculative` when no enabled model has that name, when it is the model
    itself, or when its tokenizer is not the model's."""
    from inference.models.loader import load_model
    from inference.sampling_params import PROMPT_LOOKUP, SPECULATIVE_OFF

    if speculative in (SPECULATIVE_OFF, PROMPT_LOOKUP) or speculative in engine.core.speculator.drafts:
        return
    draft = LanguageModel.objects.filter(name=speculative, is_enabled=True).first()
    if draft is None:
        raise ValueError(f"speculative={speculative!r}: no enabled model has this name")
    if draft.pk == model.pk:
        raise ValueError(f"speculative={speculative!r} is the model itself: a draft must be a smaller model")
    key = (id(engine), model.pk, draft.pk, draft.updated_at)  # (an engine id may be reused by a later load)
    # Not under `_lock`: every generation's start takes that one, and none should wait for a draft's load.
    with _draft_lock:
        if speculative in engine.core.speculator.drafts:
            return
        if key in _refused_drafts:  # its tokenizer was not the model's: no second load to learn it again
            raise ValueError(_refused_drafts[key])
        logger.info("loading model %r as the draft of %r", draft.name, model.name)
        loaded = replace(load_model(draft.to_engine_config()), name=draft.name)
        try:
            engine.attach_draft(loaded)
        except ValueError as exc:
            _refused_drafts[key] = str(exc)
            raise


def loaded_at(engine: Any) -> float | None:
    """When `engine`'s load finished (wall clock, time.time()); None for one this module did not load."""
    return _loaded_at.get(id(engine))


def preload_default_model() -> None:
    """Loads the model a request without a choice gets, before the worker takes work (called at
    worker start): the first answer then waits for no load. A failure is announced and logged;
    the worker still starts (its generations report the load error)."""
    from playground.model_choice import default_model

    choice = default_model()
    if choice.fallback_reason:
        logger.warning("%s", choice.fallback_reason)
    if choice.model is None:
        logger.info("no default model to preload")
        return
    try:
        get_engine(choice.model)
    except Exception:
        logger.exception("preloading model %r failed", choice.model.name)


def comparison_model(model: LanguageModel, precision: str) -> Any:
    """`model` loaded in another weight precision (a `LoadedModel`, no engine around it), for
    the "precision" inspection: kept until another precision or model is asked for."""
    global _comparison
    from inference.models.loader import load_model

    config = replace(model.to_engine_config(), dtype=precision)
    key = (model.pk, config)
    with _lock:
        if _comparison is None or _comparison[0] != key:
            _comparison = None
            _give_back_memory()
            logger.info("loading model %r in %s for a precision comparison", model.name, precision)
            _comparison = (key, load_model(config))
        return _comparison[1]


def loop_for(engine: Engine) -> ServeLoop:
    """The loop that owns `engine` (started on first use)."""
    with _lock:
        loop = _loops.get(id(engine))
        if loop is None or loop.engine is not engine:
            observer = ReleaseAfterLongPrompts(WorkerObserver())  # memory back after long prompts
            loop = _loops[id(engine)] = ServeLoop(engine, cancel.cancelled_among, observer)
        return loop


def _close_loop(engine: Engine) -> None:
    """Ends `engine`'s loop threads, which held it (and its weights and KV pool) for ever."""
    loop = _loops.pop(id(engine), None)
    if loop is not None:
        loop.close()


def _give_back_memory() -> None:
    """Frees what nothing references any more (a dropped model, its cycles) and returns the
    freed heap to the OS: without the trim glibc kept it, and RSS stayed at its high-water mark."""
    from inference.models.memory import release_free_memory

    gc.collect()
    release_free_memory()


def _wait_until_idle(engine: Engine) -> None:
    loop = _loops.get(id(engine))
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while loop is not None and loop.num_requests and time.monotonic() < deadline:
        time.sleep(0.1)
    if loop is not None and loop.num_requests:
        raise WorkerBusy(
            f"this worker serves {engine.info.name} to {loop.num_requests} request(s) and waited "
            f"{SWITCH_TIMEOUT_S:.0f} s for them to finish before it could load another model; try again later"
        )


class WorkerBusy(RuntimeError):
    """A model switch found the current model's requests still running after SWITCH_TIMEOUT_S:
    the server is busy, nothing is wrong with either model."""
