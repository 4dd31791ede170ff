"""One generation end to end, run by the Celery worker: the Django <-> engine bridge.

Owns: starting the queued row (its prompt is `prompt_build`'s), the cancel check, streaming
events to the generation's group (the records are `step_records`', the answer's text and
reasoning split `inference.text.reasoning.ReasoningStream`'s, the saves `row_writer`'s), and the
single terminal event (a `finally` path). A generation that can no longer be published (Redis is
gone) ends as `service_unavailable` with its partial answer saved, and its request leaves the
engine's batch (`cancel.cancel_here`: nobody reads its events any more); the task itself
survives the outage.
Must not know: sockets. The engine comes from `engines` (loaded lazily), so importing this
module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.utils import timezone

from inference.events import BeamStep, Event, Finished, Prefilled, Step
from inference.sampling_params import SamplingParams
from inference.text.reasoning import ReasoningStream
from playground import protocol
from playground.coord import cancel, liveness, store, worker_routing
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError
from playground.worker import engines
from playground.worker.engines import get_engine, loop_for
from playground.worker.prompt_build import build_prompt
from playground.worker.publisher import send_to_group
from playground.worker.row_writer import RowWriter, error_fields, finished_fields
from playground.worker.serve_loop import Outbox, ServeLoop, Waiting
from playground.worker.step_records import StepRecords

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.kv.transfer import Handoff
    from inference.vision.images import PromptImage

T = TypeVar("T")
logger = logging.getLogger(__name__)


def run_generation(
    generation_id: int,
    worker: str,
    load_engine: Callable[[LanguageModel], Engine] = get_engine,
    send: Callable[[dict[str, Any]], None] = send_to_group,
) -> None:
    """Runs one queued generation to its end; skips one that is no longer queued."""
    r = store.client()
    if not worker_routing.claim_delivery(r, generation_id, worker):  # a re-routed copy already ran or runs
        logger.info(
            "generation %s was claimed by %s; skipped", generation_id, worker_routing.claimed_by(r, generation_id)
        )
        return
    count_active(r, worker, +1)
    try:
        with liveness.generation_heartbeat(generation_id):  # beats before the row says "running"
            generation = start_queued(generation_id, worker)
            if generation is None:
                logger.info("generation %s is no longer queued; skipped", generation_id)
                return
            GenerationRun(generation, send).execute(load_engine)
        if generation.conversation_id is not None and generation.params.get("use_prefix_cache", True):
            with _unless_redis_is_gone("record where its KV is"):
                worker_routing.record_owner(r, generation.conversation_id, worker)  # its KV is here now
    finally:
        count_active(r, worker, -1)
    with _unless_redis_is_gone("clear its stop flag"):
        cancel.clear(generation_id)


@contextlib.contextmanager
def _unless_redis_is_gone(what: str) -> Iterator[None]:
    """Bookkeeping in Redis after a generation: skipped (with one line in the log) in an outage."""
    try:
        yield
    except store.OUTAGE_ERRORS as exc:
        logger.warning("could not %s: Redis is unreachable (%s)", what, exc)


_active_lock = threading.Lock()
_num_active = 0
_running: set[int] = set()  # the generations this process is running (GenerationRun.execute), under _active_lock
_stopping = threading.Event()  # set once, at the worker's shutdown
WORKER_STOPPED_MESSAGE = (
    "the worker running this generation was stopped (it shut down or restarted); the answer so far was kept"
)


def stop_for_shutdown() -> None:
    """The worker shuts down (SIGTERM, Ctrl-C): each generation of this process ends at its next
    step as `worker_lost`, with its partial answer saved and its terminal event sent, instead of
    running on until the shutdown's grace period ends in a kill that leaves its row `running`."""
    _stopping.set()
    with _active_lock:
        generation_ids = list(_running)
    for generation_id in generation_ids:
        cancel.cancel_here(generation_id)
    logger.info("shutting down: stopping %d running generation(s)", len(generation_ids))


def count_active(r: Any, worker: str, delta: int) -> None:
    """Cache-aware routing sends a conversation's next turn here only while this worker has a
    free place in its batch: it counts as busy when all its places are taken."""
    global _num_active
    with _active_lock:
        _num_active += delta
        is_busy = _num_active >= settings.PLAYGROUND_WORKER_SLOTS
    with _unless_redis_is_gone("say whether this worker is busy"):
        worker_routing.set_busy(r, worker, is_busy)


def start_queued(generation_id: int, worker: str) -> Generation | None:
    """The queued generation's row, now running on `worker`; None if it is no longer queued."""
    num_updated = Generation.objects.filter(pk=generation_id, status=Generation.Status.QUEUED).update(
        status=Generation.Status.RUNNING, started_at=timezone.now(), worker=worker
    )
    return load_row(generation_id) if num_updated else None


def load_row(generation_id: int) -> Generation:
    """The row with everything a worker reads from it (model, template, conversation)."""
    return Generation.objects.select_related("model", "chat_template", "conversation").get(pk=generation_id)


class GenerationRun:
    """One running generation: its engine request, its stream to the page, its end. The records
    sent to the page are `records`', the answer's text and reasoning split `answer`'s, the row's
    saves `row`'s."""

    def __init__(self, generation: Generation, send: Callable[[dict[str, Any]], None]) -> None:
        self.generation = generation
        self.send = _unavailable_on_outage(send)
        self.engine: Engine | None = None
        self.loop: ServeLoop | None = None  # the worker's engine loop: every engine call goes through it
        self.params: SamplingParams | None = None
        self.images: list[PromptImage] = []  # the prompt's, in order (vision-language models)
        self.answer = ReasoningStream(starts_in_reasoning=generation.opens_reasoning)  # again once rendered
        self.records = StepRecords(generation.pk, self.send, self._segments, self._num_streams)
        self.row = RowWriter(generation.pk)
        self.model_load_ms = 0.0  # > 0: the generation waited this long for its model's load
        self.prompt_record: dict[str, Any] | None = None  # as `generation.started` sent it

    def execute(self, load_engine: Callable[[LanguageModel], Engine]) -> None:
        self.run_to_end(lambda: self._generate(load_engine))

    def stream_to_end(self, events: Iterator[Event | Waiting]) -> None:
        """Streams a started generation's events (`start_like`) and ends it with their outcome."""
        self.run_to_end(lambda: self._stream(events))

    def run_to_end(self, produce: Callable[[], Finished]) -> None:
        """Runs `produce` and ends the generation with its outcome, whatever it raised."""
        outcome: Finished | CommandError = CommandError("internal_error", "the worker was interrupted")
        generation_id = self.generation.pk
        with _active_lock:
            _running.add(generation_id)
        if _stopping.is_set():  # started while the worker shuts down: it ends at its first step
            cancel.cancel_here(generation_id)
        try:
            outcome = produce()
        except CommandError as exc:
            outcome = exc
        except Exception as exc:
            logger.exception("generation %s failed", self.generation.pk)
            outcome = CommandError("internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            with _active_lock:
                _running.discard(generation_id)
            if isinstance(outcome, CommandError):  # failed: its events will not be read, out of the batch
                cancel.cancel_here(generation_id)
            self._end(outcome)

    # ---- the start -----------------------------------------------------------------------

    def _generate(self, load_engine: Callable[[LanguageModel], Engine]) -> Finished:
        _, _, _, events = self._start(load_engine, self._submit)
        return self._stream(events)

    def _submit(
        self, prompt_ids: list[int], params: SamplingParams, handoff: Handoff | None = None, prefill_only: bool = False
    ):
        images = self.images if handoff is None else []  # a handoff's images are already in its KV
        try:
            return self.loop.submit(
                prompt_ids,
                params,
                self.generation.pk,
                handoff=handoff,
                prefill_only=prefill_only,
                images=images,
                client=self.generation.owner,
            )
        except ValueError as exc:  # the engine refused the request (e.g. it could never fit the KV pool)
            raise CommandError("invalid_params", str(exc)) from exc

    def _start(
        self, load_engine: Callable[[LanguageModel], Engine], submit: Callable[[list[int], SamplingParams], T]
    ) -> tuple[Engine, SamplingParams, list[int], T]:
        """Loads the model, builds the prompt, hands it to `submit` (what it returns comes back
        last), then saves the prompt and announces `generation.started`. Submitted first, so it
        joins the next step; its events wait in their outbox until the announcement went out."""
        params = self._read_params()
        engine = self._load(load_engine)
        built = build_prompt(self.generation, self.row.answer_id, params.max_new_tokens, engine)
        self.images = list(built.prompt.images)
        prompt_ids = built.prompt.token_ids
        submitted = submit(prompt_ids, params)
        # Its record after the submit: a long prompt's per-token records take milliseconds of Python.
        self.announce(built.record(engine), len(prompt_ids))
        return engine, params, prompt_ids, submitted

    def _read_params(self) -> SamplingParams:
        self.row.answer_id = self.generation.answer_message_id()
        try:
            self.params = SamplingParams.from_dict(self.generation.params)
        except (TypeError, ValueError) as exc:  # stored by an older version with other settings
            raise CommandError("invalid_params", str(exc)) from exc
        self.records.is_beam_search = self.params.is_beam_search
        return self.params

    def start_like(self, leader: GenerationRun, prompt: dict[str, Any], num_prompt_tokens: int) -> None:
        """Starts this generation on `leader`'s engine with `leader`'s prompt (another choice of
        the same request: the prompt is built once)."""
        self._read_params()
        self.engine, self.loop = leader.engine, leader.loop
        self.announce(prompt, num_prompt_tokens)

    def announce(self, prompt: dict[str, Any], num_prompt_tokens: int) -> None:
        """Saves the prompt as the model sees it and sends `generation.started`."""
        generation = self.generation
        self.prompt_record = prompt
        self.answer = ReasoningStream(starts_in_reasoning=prompt["opens_reasoning"])
        saved_keys = ("spans", "tokens", "images", "dropped_reasoning", "num_dropped_messages", "opens_reasoning")
        self.row.save(
            prompt_text=prompt["text"],
            prompt={key: prompt[key] for key in saved_keys},
            num_prompt_tokens=num_prompt_tokens,
        )
        info = protocol.json_safe(self.engine.model_info())
        self.send(protocol.generation_started(generation.pk, generation.worker, info, self.params.to_dict(), prompt))

    def _load(self, load_engine: Callable[[LanguageModel], Engine]) -> Engine:
        self.engine, self.loop, self.model_load_ms = load_model(self.generation, load_engine, self.params)
        return self.engine

    # ---- the stream ----------------------------------------------------------------------

    def _stream(self, events: Iterator[Event | Waiting], until: type = Finished) -> Finished:
        """Sends the engine's records on until its `Finished` (or the first `until`), which it returns."""
        generation = self.generation
        if isinstance(events, Outbox):  # woken once per message, not once per step
            events.hold_until = self.records.flush_due_at
        for event in events:
            if isinstance(event, (until, Finished)):
                return event
            if isinstance(event, Waiting):
                self.send(
                    protocol.generation_waiting(generation.pk, event.position, event.num_waiting, event.waited_ms)
                )
            elif isinstance(event, Prefilled):
                self.send(protocol.generation_prefilled(generation.pk, event.to_dict()))
            elif isinstance(event, (Step, BeamStep)):
                self._on_step(event)
        raise RuntimeError("the engine ended without a Finished record")

    def _on_step(self, event: Step | BeamStep) -> None:
        if isinstance(event, Step):
            self.answer.append(event.text_delta)
        elif event.beams:
            self.answer.set_text(event.beams[0].text)
        self.records.add(event)  # after the text: a message it sends carries the segments
        self.row.save_partial(self.answer.text, self.records.texts)

    def _segments(self) -> list[dict[str, Any]]:
        return self.answer.segments_for_browser()

    def _num_streams(self) -> int:
        return self.loop.num_requests if self.loop is not None else 1

    # ---- the end -------------------------------------------------------------------------

    def _end(self, outcome: Finished | CommandError) -> None:
        """Persists the outcome and sends the one terminal event, whatever failed before."""
        generation_id = self.generation.pk
        try:
            self.records.flush()
        except Exception:
            logger.exception("generation %s: could not send the last steps", generation_id)
        if isinstance(outcome, Finished) and outcome.finish_reason == "error":
            outcome = CommandError("internal_error", outcome.error or "the engine failed")
        if isinstance(outcome, Finished) and outcome.finish_reason == "cancelled" and _stopping.is_set():
            outcome = CommandError("worker_lost", WORKER_STOPPED_MESSAGE)
        if isinstance(outcome, Finished):
            stats = self._stats(outcome)
            fields = finished_fields(outcome, stats)
            self.answer.set_text(outcome.text)  # the engine's last word (held-back text, a stop string cut)
            segments = self.answer.segments_for_browser()
            event = protocol.generation_finished(
                generation_id, self.row.answer_id, outcome.finish_reason, outcome.text, stats, segments
            )
        else:
            fields = error_fields(outcome, self.answer.text)
            event = protocol.generation_error(generation_id, outcome.code, outcome.message)
        try:
            self.row.save_outcome(fields, self.records.texts)
        except Exception:
            logger.exception("generation %s: could not save its outcome", generation_id)
        self.records.forget_recent()
        try:
            self.send(event)
        except CommandError as exc:  # Redis is gone: the followers read the saved row instead
            logger.warning("generation %s: could not send its terminal event: %s", generation_id, exc.message)
        except Exception:
            logger.exception("generation %s: could not send its terminal event", generation_id)

    def _stats(self, finished: Finished) -> dict[str, Any]:
        stats = protocol.stats_record(protocol.json_safe(finished.to_dict()), self.generation.worker)
        stats.update(self.records.stream_rate())
        if self.model_load_ms:  # the first token came after the model's load: its time counts, and says so
            stats["model_load_ms"] = self.model_load_ms
            stats["ttft_ms"] = (stats.get("ttft_ms") or 0.0) + self.model_load_ms
        if self.engine is not None:  # this worker's prefix cache after the request: hit rate, bytes, ...
            stats["prefix_cache"] = protocol.json_safe(self.engine.prefix_cache_stats())
        return stats


def load_model(
    generation: Generation, load_engine: Callable[[LanguageModel], Engine], params: SamplingParams | None = None
) -> tuple[Engine, ServeLoop, float]:
    """The generation's engine (with the draft model `params` name, if any), its loop, and how long
    the generation waited for its model's load (ms). (A handoff's params come with it, after the load.)"""
    model = generation.model
    if model is None:
        raise CommandError("model_unavailable", "the generation's model was deleted")
    try:
        engine = load_engine(model)
        loop = loop_for(engine)
    except engines.WorkerBusy as exc:
        raise CommandError("server_busy", str(exc)) from exc
    except Exception as exc:
        logger.exception("loading model %r failed", model.name)
        raise CommandError("model_unavailable", f"model {model.name!r} could not be loaded: {exc}") from exc
    if params is not None:
        load_draft(engine, model, params.speculative)
    # Created before its model finished loading (queued while the worker loaded it at start, or
    # waiting here for a switch): that wait is part of its time to first token.
    loaded_at, created_at = engines.loaded_at(engine), generation.created_at.timestamp()
    return engine, loop, (loaded_at - created_at) * 1000 if loaded_at is not None and loaded_at > created_at else 0.0


def load_draft(engine: Engine, model: LanguageModel, speculative: str) -> None:
    """The draft model `speculative` names loaded beside `engine` (speculative decoding), if it names one."""
    try:
        engines.attach_draft(engine, model, speculative)
    except ValueError as exc:
        raise CommandError("invalid_params", str(exc)) from exc
    except Exception as exc:
        logger.exception("loading the draft model %r failed", speculative)
        raise CommandError("model_unavailable", f"draft model {speculative!r} could not be loaded: {exc}") from exc


def _unavailable_on_outage(send: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """`send`, with losing Redis (the channel layer) raised as the generation's clear error
    rather than a raw connection error."""

    def send_or_fail(event: dict[str, Any]) -> None:
        try:
            send(event)
        except store.OUTAGE_ERRORS as exc:
            logger.warning("generation %s: cannot publish, Redis is unreachable: %s", event["generation_id"], exc)
            raise CommandError("service_unavailable", store.OUTAGE_MESSAGE) from exc

    return send_or_fail
