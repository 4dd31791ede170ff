"""One generation end to end, run by the Celery worker: the Django <-> engine bridge.

Owns: starting the queued row, building the prompt from the records, the cancel check,
streaming events to the generation's group, saving the partial answer, and the single
terminal event (a `finally` path). Must not know: sockets. The engine comes from
`engines` (loaded lazily), so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from inference.events import BeamStep, Event, Finished, Prefilled, Step
from inference.sampling_params import SamplingParams
from inference.text.reasoning import prompt_opens_reasoning, segments_for_browser
from inference.text.tokenization import bos_for_raw_text
from inference.vision.spans import image_spans
from playground import limits, protocol
from playground.coord import cancel, liveness, store, worker_routing
from playground.images import prompt_images
from playground.models import Generation, LanguageModel, Message
from playground.protocol import CommandError
from playground.worker import engines
from playground.worker.engines import get_engine, loop_for
from playground.worker.publisher import StepCoalescer, send_to_group
from playground.worker.serve_loop import ServeLoop, Waiting

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.kv.transfer import Handoff
    from inference.text.tokenization import TokenInfo
    from inference.vision.images import PromptImage

logger = logging.getLogger(__name__)

SAVE_PARTIAL_EVERY_S = 1.0  # what a killed worker loses at most


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
    _count_active(r, worker, +1)
    try:
        with liveness.generation_heartbeat(generation_id):  # beats before the row says "running"
            generation = start_queued(generation_id, worker)
            if generation is None:
                logger.info("generation %s is no longer queued; skipped", generation_id)
                return
            GenerationRun(generation, send).execute(load_engine)
        if generation.conversation_id is not None and generation.params.get("use_prefix_cache", True):
            worker_routing.record_owner(r, generation.conversation_id, worker)  # its KV is here now
    finally:
        _count_active(r, worker, -1)
    cancel.clear(generation_id)


_active_lock = threading.Lock()
_num_active = 0


def _count_active(r: Any, worker: str, delta: int) -> None:
    """Cache-aware routing sends a conversation's next turn here only while this worker has a
    free place in its batch: it counts as busy when all its places are taken."""
    global _num_active
    with _active_lock:
        _num_active += delta
        is_busy = _num_active >= settings.PLAYGROUND_WORKER_SLOTS
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
        self.send = send
        self.engine: Engine | None = None
        self.loop: ServeLoop | None = None  # the worker's engine loop: every engine call goes through it
        self.answer_id: int | None = None  # the assistant message (chat only)
        self.is_beam_search = False
        self.params: SamplingParams | None = None
        self.images: list[PromptImage] = []  # the prompt's, in order (vision-language models)
        self.text = ""
        self.starts_in_reasoning = prompt_opens_reasoning(generation.prompt_text)  # set again once rendered
        self.steps: list[dict[str, Any]] = []
        self.model_load_ms = 0.0  # > 0: the generation waited this long for its model's load
        self.coalescer = StepCoalescer(self._send_steps)
        self.saved_at = time.monotonic()

    def execute(self, load_engine: Callable[[LanguageModel], Engine]) -> None:
        outcome: Finished | CommandError = CommandError("internal_error", "the worker was interrupted")
        try:
            outcome = self._generate(load_engine)
        except CommandError as exc:
            outcome = exc
        except Exception as exc:
            logger.exception("generation %s failed", self.generation.pk)
            outcome = CommandError("internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            self._end(outcome)

    # ---- the generation ----------------------------------------------------------------

    def _generate(self, load_engine: Callable[[LanguageModel], Engine]) -> Finished:
        _, params, prompt_ids = self._start(load_engine)
        return self._stream(self._submit(prompt_ids, params))

    def _submit(
        self, prompt_ids: list[int], params: SamplingParams, handoff: Handoff | None = None, prefill_only: bool = False
    ):
        images = self.images if handoff is None else []  # a handoff's images are already in its KV
        try:
            return self.loop.submit(
                prompt_ids, params, self.generation.pk, handoff=handoff, prefill_only=prefill_only, images=images
            )
        except ValueError as exc:  # the engine refused the request (e.g. it could never fit the KV pool)
            raise CommandError("invalid_params", str(exc)) from exc

    def _start(self, load_engine: Callable[[LanguageModel], Engine]) -> tuple[Engine, SamplingParams, list[int]]:
        """Loads the model, builds and saves the prompt, announces `generation.started`."""
        generation = self.generation
        self.answer_id = generation.answer_message_id()
        try:
            params = SamplingParams.from_dict(generation.params)
        except (TypeError, ValueError) as exc:  # stored by an older version with other settings
            raise CommandError("invalid_params", str(exc)) from exc
        self.is_beam_search, self.params = params.is_beam_search, params
        engine = self._load(load_engine)
        info = engine.model_info()
        prompt_ids, prompt = self._prompt(engine, info["max_context"])
        self.starts_in_reasoning = prompt_opens_reasoning(prompt["text"])
        self._save(
            prompt_text=prompt["text"],
            prompt={key: prompt[key] for key in ("spans", "tokens", "images", "dropped_reasoning")},
            num_prompt_tokens=len(prompt_ids),
        )
        self.send(
            protocol.generation_started(
                generation.pk, generation.worker, protocol.json_safe(info), params.to_dict(), prompt
            )
        )
        return engine, params, prompt_ids

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
        except Exception as exc:
            logger.exception("loading model %r failed", model.name)
            raise CommandError("model_unavailable", f"model {model.name!r} could not be loaded: {exc}") from exc

    def _stream(self, events: Iterator[Event | Waiting], until: type = Finished) -> Finished:
        """Sends the engine's records on until its `Finished` (or the first `until`), which it returns."""
        generation = self.generation
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

    def _prompt(self, engine: Engine, max_context: int) -> tuple[list[int], dict[str, Any]]:
        """The prompt's token ids and its record ({text, spans, tokens}), within the limits."""
        generation = self.generation
        template = generation.chat_template.source if generation.chat_template else None
        inputs = generation.inputs
        image_records = [] if generation.kind == Generation.Kind.CHAT else inputs.get("images", [])
        if generation.kind == Generation.Kind.CHAT:
            messages, image_records = self._chat_messages(engine)
        elif inputs.get("chat"):
            messages = [{"role": "user", "content": _with_placeholders(engine, inputs["text"], image_records)}]
        else:  # raw completion: the text as it is (after its images' placeholders)
            messages = None
        dropped_reasoning: list[int] = []
        if messages is None:
            text = _with_placeholders(engine, inputs["text"], image_records)
            spans = [{"start": 0, "end": len(text), "kind": "content", "role": None}] if text else []
        else:
            try:
                rendered = engine.render_chat(messages, template)
            except ValueError as exc:  # includes ChatTemplateError
                raise CommandError("invalid_params", f"the prompt could not be built: {exc}") from exc
            text, spans = rendered.text, [span.to_dict() for span in rendered.spans]
            dropped_reasoning = list(rendered.dropped_reasoning)
        vocab_size = engine.model_info().get("vocab_size")
        bad = [i for i in inputs.get("token_ids", []) if vocab_size and not 0 <= i < vocab_size]
        if bad:
            raise CommandError("invalid_params", f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
        # On the loop thread: the tokenizer is not safe to share between threads.
        bos, tokens = self.loop.call(
            lambda: (
                None if messages is not None else bos_for_raw_text(engine.tokenizer, text),
                engine.tokenize(text) + engine.token_infos(inputs.get("token_ids", [])),
            )
        )
        if bos is not None:
            text, spans, tokens = _bos_first(bos, text, spans, tokens)
        tokens, image_blocks = self._expand_images(engine, tokens, image_records)
        limits.check_prompt_tokens(len(tokens), max_context)
        record = protocol.prompt_record(text, spans, [t.to_dict() for t in tokens], image_blocks, dropped_reasoning)
        return [t.id for t in tokens], record

    def _expand_images(
        self, engine: Engine, tokens: list[Any], image_records: list[dict[str, Any]]
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each image's placeholder token as its block of image tokens, and the blocks for the
        token view (where, how many, the patch grid, the KV bytes they take)."""
        vision = engine.vision
        if not image_records:
            return tokens, []
        if vision is None:
            raise CommandError("images_not_supported", f"model {self.generation.model.name!r} takes no images")
        expanded = []
        for token in tokens:
            expanded += [token] * (vision.tokens_per_image if token.id == vision.image_token_id else 1)
        self.images = prompt_images(image_records)
        hashes = [image.content_hash for image in self.images]
        try:
            spans = image_spans([t.id for t in expanded], vision.image_token_id, vision.tokens_per_image, hashes)
        except ValueError as exc:  # e.g. the text itself holds the image token
            raise CommandError("invalid_params", f"the images do not fit the prompt: {exc}") from exc
        kv_bytes_per_token = engine.model_info()["kv_bytes_per_token"]
        blocks = [
            protocol.image_block(span.to_dict(), vision.grid, record, span.num_tokens * kv_bytes_per_token)
            for span, record in zip(spans, image_records)
        ]
        return expanded, blocks

    def _chat_messages(self, engine: Engine) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
        """System prompt first, then the active messages before this generation's answer (each
        user message's images as placeholders before its text), and those images in order."""
        conversation = self.generation.conversation
        answer = Message.objects.get(pk=self.answer_id)
        messages = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
        images: list[dict[str, Any]] = []
        for message in conversation.active_messages().filter(position__lt=answer.position):
            if message.role == Message.Role.ASSISTANT and not message.content:
                continue  # an answer that failed before its first token: an empty turn confuses templates
            messages.append(
                {"role": message.role, "content": _with_placeholders(engine, message.content, message.images)}
            )
            images += message.images
        return messages, images

    def _on_step(self, event: Step | BeamStep) -> None:
        step = protocol.json_safe(event.to_dict())
        self.steps.append(step)
        if isinstance(event, Step):
            self.text += event.text_delta
        elif event.beams:
            self.text = event.beams[0].text
        self.coalescer.add(step)
        if time.monotonic() - self.saved_at >= SAVE_PARTIAL_EVERY_S:
            self._save(text=self.text, steps=self.steps)  # a reloaded page re-attaches from these
            self._save_answer(self.text)

    def _send_steps(self, steps: list[dict[str, Any]]) -> None:
        segments = None if self.is_beam_search else self._segments(self.text)
        self.send(protocol.generation_steps(self.generation.pk, steps, is_beam=self.is_beam_search, segments=segments))

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
            self._save(steps=self.steps, finished_at=timezone.now(), **fields)
            self._save_answer(fields["text"])
        except Exception:
            logger.exception("generation %s: could not save its outcome", generation_id)
        try:
            self.send(event)
        except Exception:
            logger.exception("generation %s: could not send its terminal event", generation_id)

    def _stats(self, finished: Finished) -> dict[str, Any]:
        stats = protocol.stats_record(protocol.json_safe(finished.to_dict()), self.generation.worker)
        if self.model_load_ms:  # the first token came after the model's load: its time counts, and says so
            stats["model_load_ms"] = self.model_load_ms
            stats["ttft_ms"] = (stats.get("ttft_ms") or 0.0) + self.model_load_ms
        if self.engine is not None:  # this worker's prefix cache after the request: hit rate, bytes, ...
            stats["prefix_cache"] = protocol.json_safe(self.engine.prefix_cache_stats(self.params))
        return stats

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
        """Updates the row while it is still running: a watchdog that declared it lost wins."""
        Generation.objects.filter(pk=self.generation.pk, status=Generation.Status.RUNNING).update(**fields)
        self.saved_at = time.monotonic()

    def _save_answer(self, text: str) -> None:
        if self.answer_id is not None:
            Message.objects.filter(pk=self.answer_id).update(content=text)


def _bos_first(
    bos: TokenInfo, text: str, spans: list[dict[str, Any]], tokens: list[TokenInfo]
) -> tuple[str, list[dict[str, Any]], list[TokenInfo]]:
    """Raw text as the model reads it (`bos_for_raw_text`): BOS first, in the prompt's text as its
    piece and as a special span, so the prompt view shows it like a template's own BOS."""
    shift = len(bos.piece)
    shifted = [{**span, "start": span["start"] + shift, "end": span["end"] + shift} for span in spans]
    return bos.piece + text, [{"start": 0, "end": shift, "kind": "special", "role": None}, *shifted], [bos, *tokens]


def _with_placeholders(engine: Engine, text: str, image_records: list[dict[str, Any]]) -> str:
    """DeepSeek-VL's convention: one image token per image, on its own line before the text."""
    if not image_records or engine.vision is None:
        return text  # a text-only model refuses the images in `_expand_images`
    return engine.vision.image_token * len(image_records) + "\n" + text
