"""Prefill/decode disaggregation: one worker prefills a request, another decodes it.

Owns: the mode (`PLAYGROUND_PD_MODE`, overridable per request by the command field `"pd"`),
the prefill task's run (prompt, prefill, first token, the KV blob stored, the decode task
queued), the decode task's run (blob fetched, verified, loaded, decoding continued to the
same channel-layer group), the hand-over record (workers, bytes, timings, timeline) and the
generation's liveness between its two workers. Must not know: sockets. Torch is imported
only inside the workers (`inference.kv_transfer`, lazily).

Liveness across the hand-over: the prefill worker stops beating but leaves the generation's
heartbeat key alive for the blob's TTL; the decode worker beats from its claim on. So a
decode worker that dies, or none that comes within the TTL, ends the generation through the
usual `worker_lost` rule, and a blob that is gone when the decode worker looks ends it with
`kv_handoff_failed`: nothing waits forever.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import redis
from django.conf import settings

from inference.events import BeamStep, Finished, Step
from playground import cancel, kv_store, liveness, protocol, runner, store
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError, get_field
from playground.publisher import send_to_group

if TYPE_CHECKING:
    from inference.engine import Engine, Handoff

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]
LoadEngine = Callable[[LanguageModel], "Engine"]
EnqueueDecode = Callable[[int, str], None]


# ---- which mode ----------------------------------------------------------------------------

def requested(content: dict[str, Any]) -> bool | None:
    """The command's optional `"pd"`: true/false overrides PLAYGROUND_PD_MODE for this request."""
    return get_field(content, "pd", bool)


def is_disaggregated(pd_requested: bool | None) -> bool:
    return pd_requested if pd_requested is not None else settings.PLAYGROUND_PD_MODE == "disaggregated"


def blob_store() -> kv_store.BlobStore:
    return kv_store.open_store(settings.PLAYGROUND_KV_STORE, settings.PLAYGROUND_KV_TTL_S, store.client())


def _now_ms() -> float:
    """Wall-clock time for the timeline: the two workers may be different machines (keep clocks in sync)."""
    return time.time() * 1000


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


# ---- the prefill worker --------------------------------------------------------------------

class _HandOverHeartbeat(liveness.Heartbeat):
    """The prefill worker's beat; `hand_over` keeps the key alive after it, until the decode
    worker beats for the generation (or the hold expires and the generation counts as lost)."""

    is_handed_over = False

    def hand_over(self, hold_s: float) -> None:
        self.stopped.set()
        self.join()
        store.client().set(self.key, 1, px=int(hold_s * 1000))
        self.is_handed_over = True

    def stop(self) -> None:
        if not self.is_handed_over:
            super().stop()


def run_prefill(generation_id: int, worker: str, enqueue_decode: EnqueueDecode,
                load_engine: LoadEngine = runner.get_engine, send: Send = send_to_group,
                blobs: kv_store.BlobStore | None = None) -> None:
    """Prefills one queued generation and hands it to a decode worker (`enqueue_decode(id, blob key)`)."""
    # The same key as the decode worker's beat, so the lost-worker rule covers both phases.
    with liveness.generation_heartbeat(generation_id, _HandOverHeartbeat) as beat:
        generation = runner.claim(generation_id, worker)
        if generation is None:
            logger.info("generation %s is no longer queued; skipped", generation_id)
            return
        run = PrefillRun(generation, send, beat, blobs or blob_store(), enqueue_decode)
        run.execute(load_engine)
    if not run.is_handed_over:  # it ended here (an error, or a request that cannot be handed over)
        cancel.clear(generation_id)


class PrefillRun(runner.GenerationRun):
    """The prompt, its prefill and first token (streamed as usual), then the hand-over."""

    def __init__(self, generation: Generation, send: Send, beat: _HandOverHeartbeat,
                 blobs: kv_store.BlobStore, enqueue_decode: EnqueueDecode) -> None:
        super().__init__(generation, send)
        self.beat, self.blobs, self.enqueue_decode = beat, blobs, enqueue_decode
        self.is_handed_over = False  # from then on the decode worker owns the row and reports the end

    def _generate(self, load_engine: LoadEngine) -> Finished | None:
        engine, params, prompt_ids = self._start(load_engine)
        if params.is_beam_search or not params.use_kv_cache:
            # Beam search keeps several caches and no-KV-cache mode none: nothing to hand over.
            return self._stream(engine.generate(prompt_ids, params, should_stop=self._should_stop))
        prefill_start = _now_ms()
        handoff = engine.prefill_for_handoff(prompt_ids, params)
        prefill_end = _now_ms()
        self.send(protocol.generation_prefilled(self.generation.pk, handoff.prefilled.to_dict()))
        self._on_step(handoff.first_step)
        self.coalescer.flush()
        record = self._store(handoff, engine.model_info()["name"])
        record["timeline"] = {"prefill_start": prefill_start, "prefill_end": prefill_end,
                              "handoff_stored": _now_ms()}
        # Everything the prefill worker writes, it writes now: from the enqueue on, the row is the decode worker's.
        self._save(text=self.text, steps=self.steps, stats=record, prefill_worker=self.generation.worker,
                   num_cached_tokens=handoff.prefilled.num_cached_tokens, prefill_ms=handoff.prefilled.prefill_ms,
                   ttft_ms=handoff.ttft_ms)
        self.beat.hand_over(self.blobs.ttl_s)
        self._enqueue_decode()
        self.is_handed_over = True
        return None

    def _store(self, handoff: Handoff, model_name: str) -> dict[str, Any]:
        from inference import kv_transfer

        t0 = time.perf_counter()
        try:
            blob = kv_transfer.serialize(handoff, model_name)
        except ValueError as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache cannot be handed over: {exc}") from exc
        serialize_ms = _ms_since(t0)
        t0 = time.perf_counter()
        try:
            self.blobs.put(self._blob_key, blob)
        except (redis.RedisError, OSError) as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache could not be stored: {exc}") from exc
        return {"prefill_worker": self.generation.worker, "kv_transfer_bytes": len(blob),
                "serialize_ms": serialize_ms, "store_ms": _ms_since(t0)}

    @property
    def _blob_key(self) -> str:
        return str(self.generation.pk)

    def _enqueue_decode(self) -> None:
        try:
            self.enqueue_decode(self.generation.pk, self._blob_key)
        except Exception as exc:
            _discard(self.blobs, self._blob_key)
            raise CommandError("kv_handoff_failed", f"the decode task could not be queued: {exc}") from exc

    def _end(self, outcome: Finished | CommandError | None) -> None:
        if not self.is_handed_over:
            super()._end(outcome)


def _discard(blobs: kv_store.BlobStore, blob_key: str) -> None:
    try:
        blobs.delete(blob_key)
    except (redis.RedisError, OSError):
        logger.warning("blob %s could not be deleted; it expires on its own", blob_key, exc_info=True)


# ---- the decode worker ---------------------------------------------------------------------

def run_decode(generation_id: int, blob_key: str, worker: str, load_engine: LoadEngine = runner.get_engine,
               send: Send = send_to_group, blobs: kv_store.BlobStore | None = None) -> None:
    """Continues a generation another worker prefilled, from its KV blob, to its end."""
    blobs = blobs or blob_store()
    with liveness.generation_heartbeat(generation_id):  # beats before the row names this worker
        decode_start = _now_ms()
        generation = _claim_for_decode(generation_id, worker)
        if generation is None:
            logger.info("generation %s is not waiting for a decode worker; skipped", generation_id)
            _discard(blobs, blob_key)
            return
        DecodeRun(generation, send, blob_key, blobs, decode_start).execute(load_engine)
    cancel.clear(generation_id)


def _claim_for_decode(generation_id: int, worker: str) -> Generation | None:
    """The generation, if it was handed over and no decode worker took it yet (exactly one does)."""
    num_updated = (Generation.objects
                   .filter(pk=generation_id, status=Generation.Status.RUNNING, decode_worker="")
                   .exclude(prefill_worker="")
                   .update(decode_worker=worker, worker=worker))
    if not num_updated:
        return None
    return Generation.objects.select_related("model", "chat_template", "conversation").get(pk=generation_id)


class DecodeRun(runner.GenerationRun):
    """Loads the prefill worker's KV blob and decodes on; the first token was streamed already."""

    def __init__(self, generation: Generation, send: Send, blob_key: str, blobs: kv_store.BlobStore,
                 decode_start: float) -> None:
        super().__init__(generation, send)
        self.blob_key, self.blobs = blob_key, blobs
        self.steps, self.text = list(generation.steps), generation.text  # the prefill worker's first token
        self.handover = {**generation.stats, "decode_worker": generation.worker}
        self.handover["timeline"] = {**self.handover.get("timeline", {}), "decode_start": decode_start}

    def _generate(self, load_engine: LoadEngine) -> Finished:
        self.answer_id = self.generation.answer_message_id()
        engine = self._load(load_engine)
        blob = self._fetch()
        t0 = time.perf_counter()
        handoff = self._verify(blob, engine)
        del blob  # the KV cache may be large: keep one copy only
        events = engine.generate(handoff.prompt_ids, handoff.params, should_stop=self._should_stop, handoff=handoff)
        next(events)  # the Prefilled record (the prefill worker announced it): the KV cache is now in place
        self.handover["load_ms"] = _ms_since(t0)
        self.handover["transfer_ms"] = self.handover.get("store_ms", 0.0) + self.handover["fetch_ms"]
        self.handover["timeline"]["kv_loaded"] = _now_ms()
        self.send(protocol.generation_handoff(self.generation.pk, self.handover))
        return self._stream(events)

    def _fetch(self) -> kv_store.BlobBytes:
        """The blob, deleted from the store whatever happens next (nobody else may load it)."""
        t0 = time.perf_counter()
        try:
            blob = self.blobs.get(self.blob_key)
        except kv_store.BlobMissing as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache is gone: {exc}") from exc
        except (redis.RedisError, OSError) as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache could not be fetched: {exc}") from exc
        finally:
            _discard(self.blobs, self.blob_key)
        self.handover["fetch_ms"] = _ms_since(t0)
        return blob

    def _verify(self, blob: kv_store.BlobBytes, engine: Engine) -> Handoff:
        from inference.kv_transfer import KVSpec, KVTransferError, deserialize

        try:
            return deserialize(blob, KVSpec.from_model_info(engine.model_info()), device=engine.device)
        except KVTransferError as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache cannot be loaded: {exc}") from exc

    def _on_step(self, event: Step | BeamStep) -> None:
        if isinstance(event, Step) and event.index == 0:
            # The prefill worker streamed the first token; keep this copy, which may carry
            # text held back until the end when the answer is one token long.
            self.steps[:1], self.text = [protocol.json_safe(event.to_dict())], event.text_delta
            return
        super()._on_step(event)

    def _stats(self, finished: Finished) -> dict[str, Any]:
        self.handover["timeline"]["decode_end"] = _now_ms()
        return {**super()._stats(finished), **{name: self.handover.get(name) for name in protocol.HANDOFF_FIELDS}}
