"""One generation end to end, run by the Celery worker: the Django <-> engine bridge.

Owns: starting the queued row (its prompt is `prompt_build`'s), the cancel check, streaming
events to the generation's group, saving the partial answer, and the single terminal event (a
`finally` path). A generation that can no longer be published (Redis is gone) ends as
`service_unavailable` with its partial answer saved, and its request leaves the engine's batch
(`cancel.cancel_here`: nobody reads its events any more); the task itself survives the outage.
Must not know: sockets. The engine comes from `engines` (loaded lazily), so importing this
module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from django.conf import settings
from django.utils import timezone

from inference.events import BeamStep, Event, Finished, Prefilled, Step
from inference.sampling_params import SamplingParams
from inference.text.reasoning import prompt_opens_reasoning, segments_for_browser
from playground import encoded_json, protocol
from playground.coord import cancel, liveness, recent_steps, store, worker_routing
from playground.encoded_json import EncodedList
from playground.models import Generation, LanguageModel, Message
from playground.protocol import CommandError
from playground.worker import engines
from playground.worker.engines import get_engine, loop_for
from playground.worker.prompt_build import build_prompt
from playground.worker.publisher import StepCoalescer, flush_delay_s, send_to_group
from playground.worker.serve_loop import Outbox, ServeLoop, Waiting

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.kv.transfer import Handoff
    from inference.vision.images import PromptImage

T = TypeVar("T")
logger = logging.getLogger(__name__)

SAVE_PARTIAL_EVERY_S = 1.0  # the answer's text: what a killed worker loses at most
# The saved steps are rewritten whole (a JSON list that grows with the answer), so saving them
# every second cost quadratic time: the fixed interval took a third of a task thread's time
# under 8 clients. They wait `len(steps) / STEPS_SAVED_PER_S` seconds (at least the text's
# interval), which keeps the total linear; the ones not saved yet are in Redis meanwhile
# (coord/recent_steps.py), where a re-attaching page reads them.
STEPS_SAVED_PER_S = 20.0


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
    """The state of one running generation: streamed steps, partial text, its outcome."""

    def __init__(self, generation: Generation, send: Callable[[dict[str, Any]], None]) -> None:
        self.generation = generation
        self.send = _unavailable_on_outage(send)
        self.engine: Engine | None = None
        self.loop: ServeLoop | None = None  # the worker's engine loop: every engine call goes through it
        self.answer_id: int | None = None  # the assistant message (chat only)
        self.is_beam_search = False
        self.params: SamplingParams | None = None
        self.images: list[PromptImage] = []  # the prompt's, in order (vision-language models)
        self.text = ""
        self.starts_in_reasoning = prompt_opens_reasoning(generation.prompt_text)  # set again once rendered
        self.step_texts: list[str] = []  # each step record as JSON text, encoded once (encoded_json)
        self.model_load_ms = 0.0  # > 0: the generation waited this long for its model's load
        self.coalescer = StepCoalescer(self._send_steps, max_delay_s=self._flush_delay_s)
        self.saved_at = self.steps_saved_at = time.monotonic()
        self.prompt_record: dict[str, Any] | None = None  # as `generation.started` sent it
        # When this stream got its first and latest token, on this worker's clock: the decode
        # rate the stream got (batched or not), which the engine's compute time alone is not.
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.num_timed_tokens = 0

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

    # ---- the generation ----------------------------------------------------------------

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
        built = build_prompt(self.generation, self.answer_id, params.max_new_tokens, engine)
        self.images = list(built.prompt.images)
        prompt_ids = built.prompt.token_ids
        submitted = submit(prompt_ids, params)
        # Its record after the submit: a long prompt's per-token records take milliseconds of Python.
        self.announce(built.record(engine), len(prompt_ids))
        return engine, params, prompt_ids, submitted

    def _read_params(self) -> SamplingParams:
        self.answer_id = self.generation.answer_message_id()
        try:
            params = SamplingParams.from_dict(self.generation.params)
        except (TypeError, ValueError) as exc:  # stored by an older version with other settings
            raise CommandError("invalid_params", str(exc)) from exc
        self.is_beam_search, self.params = params.is_beam_search, params
        return params

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
        self.starts_in_reasoning = prompt_opens_reasoning(prompt["text"])
        self._save(
            prompt_text=prompt["text"],
            prompt={
                key: prompt[key] for key in ("spans", "tokens", "images", "dropped_reasoning", "num_dropped_messages")
            },
            num_prompt_tokens=num_prompt_tokens,
        )
        info = protocol.json_safe(self.engine.model_info())
        self.send(protocol.generation_started(generation.pk, generation.worker, info, self.params.to_dict(), prompt))

    def _load(self, load_engine: Callable[[LanguageModel], Engine]) -> Engine:
        model = self.generation.model
        if model is None:
            raise CommandError("model_unavailable", "the generation's model was deleted")
        try:
            self.engine = load_engine(model)
            # Created before its model finished loading (queued while the worker loaded it at
            # start, or waiting here for a switch): that wait is part of its time to first token.
            loaded_at = engines.loaded_at(self.engine)
            created_at = self.generation.created_at.timestamp()
            if loaded_at is not None and loaded_at > created_at:
                self.model_load_ms = (loaded_at - created_at) * 1000
            self.loop = loop_for(self.engine)
            return self.engine
        except engines.WorkerBusy as exc:
            raise CommandError("server_busy", str(exc)) from exc
        except Exception as exc:
            logger.exception("loading model %r failed", model.name)
            raise CommandError("model_unavailable", f"model {model.name!r} could not be loaded: {exc}") from exc

    def _stream(self, events: Iterator[Event | Waiting], until: type = Finished) -> Finished:
        """Sends the engine's records on until its `Finished` (or the first `until`), which it returns."""
        generation = self.generation
        if isinstance(events, Outbox):  # woken once per message, not once per step
            events.hold_until = self.coalescer.flush_due_at
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
        self.last_token_at = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        self.num_timed_tokens += 1
        # Encoded once: the message, Redis' tail and every save of the row carry this text as it is.
        text = encoded_json.dumps(event.to_dict())
        self.step_texts.append(text)
        if isinstance(event, Step):
            self.text += event.text_delta
        elif event.beams:
            self.text = event.beams[0].text
        self.coalescer.add((event.index, text))
        now = time.monotonic()
        if now - self.saved_at >= SAVE_PARTIAL_EVERY_S:
            fields: dict[str, Any] = {"text": self.text}
            if now - self.steps_saved_at >= max(SAVE_PARTIAL_EVERY_S, len(self.step_texts) / STEPS_SAVED_PER_S):
                fields["steps"] = EncodedList(self.step_texts)  # a reloaded page re-attaches from these and the tail
            self._save(**fields)
            self._save_answer(self.text)

    def _flush_delay_s(self) -> float:
        return flush_delay_s(self.loop.num_requests if self.loop is not None else 1)

    def _send_steps(self, steps: list[tuple[int, str]]) -> None:
        """Publishes buffered steps, each (its index, its record's JSON text)."""
        # Kept before they are published: a page re-attaching in between reads them there
        # (coord/recent_steps.py); the row has them after the next save.
        try:
            recent_steps.append(self.generation.pk, steps)
        except redis.RedisError:
            logger.warning("generation %s: the recent steps could not be kept", self.generation.pk, exc_info=True)
        segments = None if self.is_beam_search else self._segments(self.text)
        texts = [text for _, text in steps]
        self.send(protocol.generation_steps(self.generation.pk, texts, is_beam=self.is_beam_search, segments=segments))

    def _segments(self, text: str) -> list[dict[str, Any]]:
        return segments_for_browser(text, starts_in_reasoning=self.starts_in_reasoning)

    # ---- the end -------------------------------------------------------------------------

    def _end(self, outcome: Finished | CommandError) -> None:
        """Persists the outcome and sends the one terminal event, whatever failed before."""
        generation_id = self.generation.pk
        try:
            self.coalescer.flush()
        except Exception:
            logger.exception("generation %s: could not send the last steps", generation_id)
        if isinstance(outcome, Finished) and outcome.finish_reason == "error":
            outcome = CommandError("internal_error", outcome.error or "the engine failed")
        if isinstance(outcome, Finished) and outcome.finish_reason == "cancelled" and _stopping.is_set():
            outcome = CommandError("worker_lost", WORKER_STOPPED_MESSAGE)
        if isinstance(outcome, Finished):
            stats = self._stats(outcome)
            fields = self._finished_fields(outcome, stats)
            event = protocol.generation_finished(
                generation_id, self.answer_id, outcome.finish_reason, outcome.text, stats, self._segments(outcome.text)
            )
        else:
            fields = {
                "status": Generation.Status.ERROR,
                "finish_reason": "error",
                "text": self.text,
                "error_code": outcome.code,
                "error_message": outcome.message,
            }
            event = protocol.generation_error(generation_id, outcome.code, outcome.message)
        try:
            self._save(steps=EncodedList(self.step_texts), finished_at=timezone.now(), **fields)
            self._save_answer(fields["text"])
        except Exception:
            logger.exception("generation %s: could not save its outcome", generation_id)
        try:
            recent_steps.delete(generation_id)  # the row holds every step now
        except redis.RedisError:
            logger.warning("generation %s: its recent steps expire on their own", generation_id, exc_info=True)
        try:
            self.send(event)
        except CommandError as exc:  # Redis is gone: the followers read the saved row instead
            logger.warning("generation %s: could not send its terminal event: %s", generation_id, exc.message)
        except Exception:
            logger.exception("generation %s: could not send its terminal event", generation_id)

    def _stats(self, finished: Finished) -> dict[str, Any]:
        stats = protocol.stats_record(protocol.json_safe(finished.to_dict()), self.generation.worker)
        stats.update(self._stream_rate())
        if self.model_load_ms:  # the first token came after the model's load: its time counts, and says so
            stats["model_load_ms"] = self.model_load_ms
            stats["ttft_ms"] = (stats.get("ttft_ms") or 0.0) + self.model_load_ms
        if self.engine is not None:  # this worker's prefix cache after the request: hit rate, bytes, ...
            stats["prefix_cache"] = protocol.json_safe(self.engine.prefix_cache_stats())
        return stats

    def _stream_rate(self) -> dict[str, Any]:
        """`stream_decode_ms` (first token to last, wall clock) and `stream_decode_tok_s` (tokens
        after the first over that time; None with fewer than two): what the client got."""
        if self.first_token_at is None:
            return {"stream_decode_ms": 0.0, "stream_decode_tok_s": None}
        seconds = self.last_token_at - self.first_token_at
        rate = (self.num_timed_tokens - 1) / seconds if self.num_timed_tokens > 1 and seconds > 0 else None
        return {"stream_decode_ms": seconds * 1000, "stream_decode_tok_s": rate}

    def _finished_fields(self, finished: Finished, stats: dict[str, Any]) -> dict[str, Any]:
        is_cancelled = finished.finish_reason == "cancelled"
        return {
            "status": Generation.Status.CANCELLED if is_cancelled else Generation.Status.FINISHED,
            "finish_reason": finished.finish_reason,
            "text": finished.text,
            "stats": stats,
            "num_prompt_tokens": finished.num_prompt_tokens,
            "num_cached_tokens": finished.num_cached_tokens,
            "num_generated_tokens": finished.num_generated_tokens,
            "prefill_ms": finished.prefill_ms,
            "ttft_ms": stats.get("ttft_ms"),
            "decode_tok_s": finished.decode_tok_s,
        }

    def _save(self, **fields: Any) -> None:
        """Updates the row while it is still running: a watchdog that declared it lost wins.
        Saved steps leave the recent-steps tail (after the save: a reader in between finds them
        in one or the other)."""
        for name in ("text", "prompt_text"):  # what the model wrote may hold U+0000: PostgreSQL refuses it
            if name in fields:
                fields[name] = encoded_json.without_nul(fields[name])
        num_updated = Generation.objects.filter(pk=self.generation.pk, status=Generation.Status.RUNNING).update(
            **fields
        )
        self.saved_at = time.monotonic()
        if "steps" not in fields:
            return
        self.steps_saved_at = self.saved_at
        if num_updated:
            try:
                recent_steps.trim_saved(self.generation.pk, len(fields["steps"]))
            except redis.RedisError:
                logger.warning("generation %s: the recent steps were not trimmed", self.generation.pk, exc_info=True)

    def _save_answer(self, text: str) -> None:
        if self.answer_id is not None:
            Message.objects.filter(pk=self.answer_id).update(content=encoded_json.without_nul(text))


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
