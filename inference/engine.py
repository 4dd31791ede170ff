"""The engine: the one surface the worker uses.

Owns: wiring a loaded model to its runner, prompt builder and batching core, and the calls the
worker makes: `add_request()` / `step()` / `cancel()` (many requests at once: every one goes
through the batch), `generate()` (one request alone: a batch-1 facade over the same path),
the prefill/decode handoff's blob, `info` (a `ModelInfo`) and `stats()` (the live view's and
the metrics' numbers). Must not know: Django, Celery, Channels, sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from inference.config import EngineConfig
from inference.core.batch_stats import batch_stats, prefix_cache_stats
from inference.engine_core import BatchStep, EngineCore
from inference.events import Event, Finished
from inference.introspect.passes import InspectionPasses
from inference.kv.transfer import HandedOff, Handoff, KVSpec, deserialize, serialize
from inference.model_info import ModelInfo
from inference.models.loader import LoadedModel, load_model
from inference.models.runner import ModelRunner
from inference.requests import Vocabulary
from inference.sampling_params import SamplingParams
from inference.speculative.draft import DraftModel, check_same_tokenizer
from inference.text.prompt import PromptBuilder
from inference.vision.encoder import VisionSpec
from inference.vision.images import PromptImage

ShouldCancel = Callable[[], bool]


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded, self.config = loaded, config
        self.model, self.device = loaded.model, loaded.device
        self.runner = ModelRunner(loaded, config)
        vision = VisionSpec.of(self.model, loaded.tokenizer, loaded.image_processor)  # None: text only
        vocab_size = self.model.get_input_embeddings().num_embeddings  # (gguf's BlockEmbedding: without its table)
        self.prompts = PromptBuilder(
            loaded.tokenizer, loaded.chat_template, loaded.name, vocab_size, loaded.max_context, vision
        )
        self.vocab = Vocabulary(
            loaded.tokenizer,
            self.prompts.table,
            tuple(loaded.eos_token_ids),
            self.prompts.think_close_ids(),
            loaded.max_context,
            vocab_size,
        )
        self.core = EngineCore(self.runner, self.vocab, config, vision)
        self.info = ModelInfo.describe(loaded, self.runner, vision)

    def attach_draft(self, loaded: LoadedModel) -> None:
        """`loaded` (a smaller model with this one's tokenizer) proposes tokens for the requests
        whose `speculative` is its name; a ValueError when its tokenizer differs."""
        check_same_tokenizer(self.loaded, loaded)
        # Its KV pool: a quarter of the model's budget (a draft is smaller, and keeps only what it proposes from).
        config = replace(self.config, kv_cache_bytes=self.config.kv_cache_bytes // 4)
        self.core.speculator.drafts[loaded.name] = DraftModel(loaded, config, self.vocab.num_logits).proposer

    @classmethod
    def load(cls, config: EngineConfig, progress: Callable[[str], None] | None = None) -> Engine:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        engine = cls(load_model(config, progress), config)
        if progress:
            progress(f"engine ready: {engine.info.name} on {engine.device} ({engine.runner.name} runner)")
        return engine

    def model_info(self) -> dict[str, Any]:
        return self.info.to_dict()

    @property
    def vision(self) -> VisionSpec | None:
        return self.prompts.vision

    @property
    def passes(self) -> InspectionPasses:
        """The inspections' passes through the served path (`introspect/passes.py`)."""
        return self.core.passes

    # ---- many requests at once: add_request(), then step() until none is unfinished ------------

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        handoff: Handoff | None = None,
        prefill_only: bool = False,
        images: Sequence[PromptImage] = (),
        client: str = "",
    ) -> int:
        """Queue a request; its events come out of `step()`. Bad input raises `ValueError` here
        (a `PromptError` for the prompt). `handoff`: prefilled on another worker; its KV is
        loaded into this batch's blocks. `prefill_only`: the request ends after its first token
        with a `HandedOff` record (its KV exported for a decode worker). `images`: their blocks
        of image tokens are in `prompt_ids` (`prompts.expand_image_placeholders`), in order.
        `client`: who asked (a session, an API key); the prefill budget is shared between clients."""
        if handoff is not None:
            return self.core.add_handoff(handoff, client)
        if prefill_only and (params.is_beam_search or not params.use_kv_cache):
            raise ValueError("prefill/decode handoff needs use_kv_cache=True and num_beams=1")
        ids, spans = self.prompts.check(prompt_ids, params, images)
        return self.core.add(ids, params, images=images, image_spans=spans, prefill_only=prefill_only, client=client)[0]

    def add_choices(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        num_choices: int,
        images: Sequence[PromptImage] = (),
        client: str = "",
    ) -> list[int]:
        """`num_choices` requests that share one prefill of the prompt (parallel sampling: the
        choices fork its KV blocks), seeded seed, seed + 1, ... when `params.seed` is set."""
        if params.is_beam_search:
            raise ValueError("several choices of a beam search: use num_return_sequences")
        ids, spans = self.prompts.check(prompt_ids, params, images)
        return self.core.add(ids, params, images=images, image_spans=spans, num_choices=num_choices, client=client)

    def cancel(self, request_id: int) -> None:
        """The request ends with finish reason "cancelled" at its next step (unknown ids are ignored)."""
        self.core.cancel(request_id)

    def step(self) -> list[tuple[int, Event]]:
        """One step for every unfinished request: (request_id, event) pairs in order."""
        return self.core.step()

    @property
    def has_unfinished(self) -> bool:
        return self.core.has_unfinished

    def waiting_request_ids(self) -> list[int]:
        """Requests queued for room in the batch, next first."""
        owners = self.core.owners
        ids = (owners[seq.seq_id].request_id for seq in self.core.scheduler.waiting if seq.seq_id in owners)
        return list(dict.fromkeys(ids))

    def abort_all(self) -> None:
        """Forget every request (after a failed step, whose state cannot be trusted)."""
        self.core.abort_all()

    @property
    def last_batch_step(self) -> BatchStep | None:
        return self.core.last_step

    def stats(self) -> dict[str, Any]:
        """The batch and its KV pool now: for the live view and the metrics."""
        core = self.core
        return batch_stats(core.scheduler, core.num_steps, self.runner.bytes_per_token)

    def prefix_cache_stats(self) -> dict[str, Any]:
        """The prefix cache: the KV blocks every request shares by hash."""
        return prefix_cache_stats(self.core.block_manager, self.runner.bytes_per_token)

    # ---- one request alone -------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        should_cancel: ShouldCancel | None = None,
        handoff: Handoff | None = None,
        images: Sequence[PromptImage] = (),
    ) -> Iterator[Event]:
        """Yield `Prefilled`, one `Step` per token (`BeamStep`s under beam search), then one
        `Finished`: the batch path with this request alone in it. `should_cancel` is polled after
        every step. The engine must have no other request in flight (their events would be lost)."""
        if self.has_unfinished:
            raise RuntimeError("generate() runs one request alone; this engine has requests in flight")
        request_id = self.add_request(prompt_ids, params, handoff=handoff, images=images)
        yield from self._events_of(request_id, should_cancel)

    def prefill_for_handoff(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[PromptImage] = ()
    ) -> Handoff:
        """Run only the prefill (and the first token) and package the KV for another worker."""
        request_id = self.add_request(prompt_ids, params, prefill_only=True, images=images)
        return next(e for e in self._events_of(request_id, None) if isinstance(e, HandedOff)).handoff

    def _events_of(self, request_id: int, should_cancel: ShouldCancel | None) -> Iterator[Event]:
        while True:
            for rid, event in self.step():
                if rid == request_id:
                    yield event
                    if isinstance(event, (Finished, HandedOff)):
                        return
            if should_cancel is not None and should_cancel():
                self.cancel(request_id)

    def export_handoff(self, handoff: Handoff) -> bytes:
        """The handoff as a blob for another worker (`inference.kv.transfer`'s format)."""
        return serialize(handoff, self.info.name)

    def import_handoff(self, blob: bytes | bytearray | memoryview) -> Handoff:
        """A blob from a prefill worker, verified against this engine's model and KV geometry
        (`KVTransferError` naming the defect), on this engine's device."""
        return deserialize(blob, KVSpec.from_model_info(self.model_info()), device=self.device)
