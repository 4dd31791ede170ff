"""Prefill/decode disaggregation: one worker prefills a request, another decodes it.

Owns (the mode is `playground.dispatch`'s): the prefill task's run (prompt, prefill, first
token, the KV blob stored, the decode task queued), the decode task's run (blob fetched,
verified, loaded, decoding continued to the same channel-layer group), the handoff record
(workers, bytes, timings, timeline) and the generation's liveness between its two workers.
Must not know: sockets. The blob format is the engine's (`Engine.export_handoff` /
`import_handoff`), where it is stored `coord.kv_store`'s.

Liveness across the handoff: the prefill worker stops beating but leaves the generation's
heartbeat key alive for the blob's TTL; the decode worker beats from its claim on. So a
decode worker that dies, or none that comes within the TTL, ends the generation through the
usual `worker_lost` rule, and a blob that is gone when the decode worker looks ends it with
`kv_handoff_failed`: nothing waits forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings

from inference.events import BeamStep, Finished, Prefilled, Step
from inference.kv.transfer import HandedOff
from playground import encoded_json, protocol
from playground.coord import cancel, kv_store, liveness, store
from playground.encoded_json import EncodedList
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError
from playground.worker.engines import get_engine
from playground.worker.generation import GenerationRun, load_draft, load_model, load_row, start_queued
from playground.worker.publisher import send_to_group

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.events import Event
    from inference.kv.transfer import Handoff
    from inference.sampling_params import SamplingParams
    from playground.worker.serve_loop import Waiting

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]
LoadEngine = Callable[[LanguageModel], "Engine"]
EnqueueDecode = Callable[[int, str], None]


def blob_store() -> kv_store.BlobStore:
    return kv_store.open_store(settings.PLAYGROUND_KV_STORE, settings.PLAYGROUND_KV_TTL_S, store.client())


def _hands_over(params: SamplingParams) -> bool:
    """Whether the prefill worker hands this request's KV to a decode worker: not for beam search
    (several caches) nor without a KV cache (nothing to hand over)."""
    return not params.is_beam_search and params.use_kv_cache


def _now_ms() -> float:
    """Wall-clock time for the timeline: the two workers may be different machines (keep clocks in sync)."""
    return time.time() * 1000


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


# ---- the prefill worker --------------------------------------------------------------------


def run_prefill(
    generation_id: int,
    worker: str,
    enqueue_decode: EnqueueDecode,
    load_engine: LoadEngine = get_engine,
    send: Send = send_to_group,
    blobs: kv_store.BlobStore | None = None,
) -> None:
    """Prefills one queued generation and hands it to a decode worker (`enqueue_decode(id, blob key)`)."""
    # The same key as the decode worker's beat, so the lost-worker rule covers both phases.
    with liveness.generation_heartbeat(generation_id) as beat:
        generation = start_queued(generation_id, worker)
        if generation is None:
            logger.info("generation %s is no longer queued; skipped", generation_id)
            return
        run = PrefillRun(generation, send, beat, blobs or blob_store(), enqueue_decode)
        run.execute(load_engine)
    if not run.is_handed_off:  # it ended here (an error, or a request that cannot be handed over)
        cancel.clear(generation_id)


class PrefillRun(GenerationRun):
    """The prompt, its prefill and first token (streamed as usual), then the handoff."""

    def __init__(
        self,
        generation: Generation,
        send: Send,
        beat: liveness.Heartbeat,
        blobs: kv_store.BlobStore,
        enqueue_decode: EnqueueDecode,
    ) -> None:
        super().__init__(generation, send)
        self.beat, self.blobs, self.enqueue_decode = beat, blobs, enqueue_decode
        self.is_handed_off = False  # from then on the decode worker owns the row and reports the end

    def _load(self, load_engine: LoadEngine) -> Engine:
        """The model without a draft: a request that speculates is handed over, and its decode
        worker loads the draft it names."""
        self.engine, self.loop, self.model_load_ms = load_model(self.generation, load_engine)
        return self.engine

    def _generate(self, load_engine: LoadEngine) -> Finished | None:
        prefill_start = 0.0

        def submit(prompt_ids: list[int], params: SamplingParams) -> Iterator[Event | Waiting]:
            nonlocal prefill_start
            prefill_start = _now_ms()
            # Beam search keeps several caches and no-KV-cache mode none: nothing to hand over.
            return self._submit(prompt_ids, params, prefill_only=_hands_over(params))

        engine, params, _, events = self._start(load_engine, submit)
        if not _hands_over(params):
            return self._stream(events)
        # The prefill and first token in this worker's batch (streamed as usual), then the handoff.
        outcome = self._stream(events, until=HandedOff)
        if isinstance(outcome, Finished):  # cancelled while it waited for room in the batch
            return outcome
        handoff = outcome.handoff
        prefill_end = _now_ms()
        self.records.flush()
        record = self._store(handoff, engine)
        record["timeline"] = {"prefill_start": prefill_start, "prefill_end": prefill_end, "handoff_stored": _now_ms()}
        # Everything the prefill worker writes, it writes now: from the enqueue on, the row is the decode worker's.
        self.row.save(
            text=self.answer.text,
            steps=EncodedList(self.records.texts),
            stats=record,
            prefill_worker=self.generation.worker,
            num_cached_tokens=handoff.prefilled.num_cached_tokens,
            prefill_ms=handoff.prefilled.prefill_ms,
            ttft_ms=handoff.ttft_ms,
        )
        self.beat.hand_off(self.blobs.ttl_s)
        self._enqueue_decode()
        self.is_handed_off = True
        return None

    def _store(self, handoff: Handoff, engine: Engine) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            blob = engine.export_handoff(handoff)
        except ValueError as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache cannot be handed over: {exc}") from exc
        serialize_ms = _ms_since(t0)
        t0 = time.perf_counter()
        try:
            self.blobs.put(self._blob_key, blob)
        except (redis.RedisError, OSError) as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache could not be stored: {exc}") from exc
        return {
            "prefill_worker": self.generation.worker,
            "kv_transfer_bytes": len(blob),
            "serialize_ms": serialize_ms,
            "store_ms": _ms_since(t0),
        }

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
        if not self.is_handed_off:
            super()._end(outcome)


def _discard(blobs: kv_store.BlobStore, blob_key: str) -> None:
    try:
        blobs.delete(blob_key)
    except (redis.RedisError, OSError):
        logger.warning("blob %s could not be deleted; it expires on its own", blob_key, exc_info=True)


# ---- the decode worker ---------------------------------------------------------------------


def run_decode(
    generation_id: int,
    blob_key: str,
    worker: str,
    load_engine: LoadEngine = get_engine,
    send: Send = send_to_group,
    blobs: kv_store.BlobStore | None = None,
) -> None:
    """Continues a generation another worker prefilled, from its KV blob, to its end."""
    blobs = blobs or blob_store()
    with liveness.generation_heartbeat(generation_id):  # beats before the row names this worker
        decode_start = _now_ms()
        generation = start_decode(generation_id, worker)
        if generation is None:
            logger.info("generation %s is not waiting for a decode worker; skipped", generation_id)
            _discard(blobs, blob_key)
            return
        DecodeRun(generation, send, blob_key, blobs, decode_start).execute(load_engine)
    cancel.clear(generation_id)


def start_decode(generation_id: int, worker: str) -> Generation | None:
    """The generation, if it was handed over and no decode worker took it yet (exactly one does)."""
    num_updated = (
        Generation.objects.filter(pk=generation_id, status=Generation.Status.RUNNING, decode_worker="")
        .exclude(prefill_worker="")
        .update(decode_worker=worker, worker=worker)
    )
    return load_row(generation_id) if num_updated else None


class DecodeRun(GenerationRun):
    """Loads the prefill worker's KV blob and decodes on; the first token was streamed already."""

    def __init__(
        self, generation: Generation, send: Send, blob_key: str, blobs: kv_store.BlobStore, decode_start: float
    ) -> None:
        super().__init__(generation, send)
        self.blob_key, self.blobs = blob_key, blobs
        self.answer.set_text(generation.text)  # the prefill worker's first token
        self.handoff_record = {**generation.stats, "decode_worker": generation.worker}
        self.handoff_record["timeline"] = {**self.handoff_record.get("timeline", {}), "decode_start": decode_start}

    def _generate(self, load_engine: LoadEngine) -> Finished:
        self.row.answer_id = self.generation.answer_message_id()
        engine = self._load(load_engine)
        blob = self._fetch()
        t0 = time.perf_counter()
        handoff = self._verify(blob, engine)
        del blob  # the KV cache may be large: keep one copy only
        self.params = handoff.params
        load_draft(engine, self.generation.model, handoff.params.speculative)
        events = self._submit(handoff.prompt_ids, handoff.params, handoff=handoff)
        # Up to the Prefilled record (the prefill worker announced it): the KV cache is in place
        # then; before it, the request may wait for room in this worker's batch.
        if isinstance(early := self._stream(events, until=Prefilled), Finished):
            return early  # cancelled while it waited for room in the batch
        self.handoff_record["load_ms"] = _ms_since(t0)
        self.handoff_record["transfer_ms"] = self.handoff_record.get("store_ms", 0.0) + self.handoff_record["fetch_ms"]
        self.handoff_record["timeline"]["kv_loaded"] = _now_ms()
        self.send(protocol.generation_handoff(self.generation.pk, self.handoff_record))
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
        self.handoff_record["fetch_ms"] = _ms_since(t0)
        return blob

    def _verify(self, blob: kv_store.BlobBytes, engine: Engine) -> Handoff:
        from inference.kv.transfer import KVTransferError

        try:
            return engine.import_handoff(blob)
        except KVTransferError as exc:
            raise CommandError("kv_handoff_failed", f"the prefilled KV cache cannot be loaded: {exc}") from exc

    def _on_step(self, event: Step | BeamStep) -> None:
        if isinstance(event, Step) and event.index == 0:
            # The prefill worker streamed the first token; keep this copy, which may carry
            # text held back until the end when the answer is one token long.
            self.records.texts[:1] = [encoded_json.dumps(event.to_dict())]
            self.answer.set_text(event.text_delta)
            return
        super()._on_step(event)

    def _stats(self, finished: Finished) -> dict[str, Any]:
        self.handoff_record["timeline"]["decode_end"] = _now_ms()
        return {**super()._stats(finished), **{name: self.handoff_record.get(name) for name in protocol.HANDOFF_FIELDS}}
