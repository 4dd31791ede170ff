"""The engine: prefill once, then decode one token per step, yielding what happened.

Owns: the generation loop (prefill -> sample -> append -> repeat until a stop), its timings,
the step records, stop conditions, prefix-cache reuse and the prefill/decode handoff
points. Delegates the forward pass to a runner (`runner_llama` or `runner_hf`), token
choice to `sampler`, text to `tokenization`, chat rendering to `chat_template`, beam search
to `beam`. Must not know: Django, Celery, Channels, sockets.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from inference.alone import AloneRequests
from inference.batching import BatchStep, ContinuousBatcher
from inference.config import EngineConfig
from inference.core.sequence import Sequence as CoreSequence
from inference.events import Alternative, Event, Finished, Prefilled, Step
from inference.introspect.moe import PassRouting
from inference.kv.cache import KVCache, LayerKV
from inference.kv.prefix_cache import PrefixCache
from inference.kv.transfer import HandedOff, Handoff, KVSpec, deserialize, serialize
from inference.models import llama as runner_llama
from inference.models.hf import HFRunner
from inference.models.loader import LoadedModel, architecture_of, load_model
from inference.models.precision import weight_stats
from inference.sampling.beam import beam_search
from inference.sampling.sampler import Sampler, entropy, token_rank, top_alternatives
from inference.sampling.stopping import StopStringMatcher
from inference.sampling.thinking import ThinkingTracker
from inference.sampling_params import SamplingParams
from inference.text.chat_template import RenderedPrompt, TemplateTokens, render_chat
from inference.text.reasoning import THINK_CLOSE, prompt_opens_reasoning
from inference.text.tokenization import (
    IncrementalDetokenizer,
    TokenInfo,
    text_deltas,
    token_infos,
    token_table,
    tokenize,
)
from inference.vision.encoder import VisionSpec
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan, cache_key_ids, cut_before_image, image_spans

ShouldCancel = Callable[[], bool]


@dataclass
class _Run:
    """The mutable state of one generation (one request)."""

    prompt_ids: list[int]
    params: SamplingParams
    sampler: Sampler
    cache: KVCache | None
    context_ids: torch.Tensor  # (max_total,) prompt + generated, written in place
    num_tokens: int  # valid length of context_ids
    detokenizer: IncrementalDetokenizer
    stopper: StopStringMatcher
    thinking: ThinkingTracker
    started_at: float
    generated_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefilled: Prefilled | None = None
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    seq: CoreSequence | None = None  # batched requests: the scheduler's view (its KV is in the paged pool)
    images: tuple[PromptImage, ...] = ()  # their pixels: for the prefill (and every step without a KV cache)
    image_spans: tuple[ImageSpan, ...] = ()  # where each image's tokens are; they key the prefix cache
    moe_routing: tuple[dict, ...] | None = None  # the last forward pass's routing (MoE models): the next step's


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.config = config
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.max_context = loaded.max_context
        self.eos_token_ids = tuple(loaded.eos_token_ids)
        use_lean = config.runner == "auto" and runner_llama.supports(self.model)
        self.runner = (
            runner_llama.LlamaRunner(self.model, self.max_context, config.batch_invariant)
            if use_lean
            else HFRunner(self.model)
        )
        self.prefix_cache = PrefixCache(config.prefix_cache_bytes)
        self.token_table = token_table(self.tokenizer)
        self.template_tokens = TemplateTokens.from_tokenizer(self.tokenizer)
        self.think_close_ids = self._think_close_ids()
        self.batcher = ContinuousBatcher(self, self.runner, config) if use_lean else None
        self._request_ids = itertools.count()
        self.alone = AloneRequests()
        self.num_not_cached_sliding_window = 0
        self.vision = VisionSpec.of(self.model, self.tokenizer, loaded.image_processor)  # None: text only
        self.routing = PassRouting(self.model)  # hooks the routers of each alone pass (none on a dense model)

    @classmethod
    def load(cls, config: EngineConfig, progress: Callable[[str], None] | None = None) -> "Engine":
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        engine = cls(load_model(config, progress), config)
        if progress:
            progress(f"engine ready: {engine.loaded.name} on {engine.device} ({engine.runner.name} runner)")
        return engine

    # ---- what the model is -------------------------------------------------------------

    def model_info(self) -> dict:
        """What the model is (fixed for the engine's life: computed once, then a copy per call)."""
        if not hasattr(self, "_model_info"):
            self._model_info = self._describe_model()
        return dict(self._model_info)

    def _describe_model(self) -> dict:
        cfg = self.model.config.get_text_config()  # a vision-language model's language half
        num_params, weight_bytes = weight_stats(self.model)
        quantization = self.loaded.quantization
        return {
            "name": self.loaded.name,
            "architecture": architecture_of(self.model),
            "model_type": getattr(cfg, "model_type", ""),
            "num_params": num_params,
            "weight_bytes": weight_bytes,
            "num_layers": getattr(cfg, "num_hidden_layers", None),
            "hidden_size": getattr(cfg, "hidden_size", None),
            "vocab_size": getattr(cfg, "vocab_size", None),
            "dtype": str(self.loaded.dtype).removeprefix("torch."),
            "precision": self.loaded.precision or str(self.loaded.dtype).removeprefix("torch."),
            "quantization": quantization.to_dict() if quantization else None,
            "device": str(self.device),
            "max_context": self.max_context,
            "eos_token_ids": list(self.eos_token_ids),
            "kv_bytes_per_token": self.kv_bytes_per_token(),
            "runner": self.runner.name,
            # What runs between the matmuls: the fused CPU kernels, or torch's ops (GPU, no compiler).
            "kernels": "fused CPU kernels" if getattr(self.runner, "fused", None) else "torch ops",
            # Whether a token's numbers are the same whatever shares its step and however its
            # prefix was computed (the fused kernels' default; not the fast mode, torch ops or other runners).
            "batch_invariant": bool(getattr(getattr(self.runner, "fused", None), "is_batch_invariant", False)),
            "has_chat_template": bool(self.loaded.chat_template),
            "sliding_window": self.sliding_window,
            "num_moe_layers": len(self.routing.routers),  # 0: dense; the explorer offers the MoE view if > 0
            "moe": self.routing.settings,  # None: dense; else how to read a step's `moe_routing`
            "vision": self.vision.to_dict() if self.vision else None,  # None: the model takes no images
        }

    def kv_bytes_per_token(self) -> int:
        """Measured: the KV cache of a one-token forward pass."""
        if not hasattr(self, "_kv_bytes_per_token"):
            cache = self.runner.new_cache(1)
            self.runner.forward(torch.tensor([self.eos_token_ids[0] if self.eos_token_ids else 0]), cache)
            self._kv_bytes_per_token = cache.nbytes
        return self._kv_bytes_per_token

    # ---- text ------------------------------------------------------------------------

    def render_chat(
        self, messages: list[dict], template: str | None = None, add_generation_prompt: bool = True
    ) -> RenderedPrompt:
        source = template or self.loaded.chat_template
        if not source:
            raise ValueError(f"model {self.loaded.name!r} has no chat template; choose one")
        return render_chat(
            messages, source, special_tokens=self.template_tokens, add_generation_prompt=add_generation_prompt
        )

    def expand_image_placeholders(self, token_ids: Sequence[int]) -> list[int]:
        """Each image token (one per image, as the chat template writes it) as the image's block
        of tokens: the prompt `generate(..., images=...)` takes. Text-only models: unchanged."""
        return self.vision.expand_placeholders(token_ids) if self.vision else list(token_ids)

    def tokenize(self, text: str) -> list[TokenInfo]:
        return tokenize(self.tokenizer, text)

    def encode(self, text: str) -> list[int]:
        return [t.id for t in self.tokenize(text)]

    def token_infos(self, token_ids: Sequence[int]) -> list[TokenInfo]:
        return token_infos(self.tokenizer, list(token_ids))

    def piece(self, token_id: int) -> str:
        return self.token_table.piece_of(token_id)

    def _think_close_ids(self) -> tuple[int, ...]:
        """`</think>` as the thinking budget forces it: the vocabulary's own token when it has
        one (R1's tokenizers do), else the tag's token sequence."""
        if THINK_CLOSE in self.token_table.pieces:
            return (self.token_table.pieces.index(THINK_CLOSE),)
        return tuple(self.encode(THINK_CLOSE))

    def _opens_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt leaves a `<think>` open (R1's template ends with one), read from
        the tokens' own text so a tag the tokenizer treats as special counts too."""
        raw = b"".join(self.token_table.bytes_of(i) for i in prompt_ids)
        return prompt_opens_reasoning(raw.decode("utf-8", errors="replace"))

    def prefix_cache_stats(self, params: SamplingParams | None = None) -> dict:
        """The counters of the prefix cache a request with `params` uses: the batch's shared KV
        blocks, or the radix cache of requests that run alone (also when `params` is None)."""
        if params is not None and self.batcher is not None and self.batcher.accepts(params):
            return self.batcher.prefix_cache_stats()
        return {
            **self.prefix_cache.stats(),
            "sliding_window": self.sliding_window,
            "num_not_cached_sliding_window": self.num_not_cached_sliding_window,
        }

    @property
    def sliding_window(self) -> int | None:
        """Tokens of attention window when the model uses one (its cache then forgets older
        positions, so a longer conversation cannot be reused as a prefix); None otherwise."""
        cfg = self.model.config
        window = getattr(cfg, "sliding_window", None)
        return window if window and getattr(cfg, "use_sliding_window", True) else None

    # ---- many requests at once: add_request(), then step() until none is unfinished --------

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        handoff: Handoff | None = None,
        prefill_only: bool = False,
        images: Sequence[PromptImage] = (),
    ) -> int:
        """Queue a request; its events come out of `step()`. Bad input raises `ValueError` here.

        Requests share each forward pass (continuous batching) on the lean runner's models; beam
        search, the no-KV-cache mode and other models run alone, advanced one event per step
        between the batch's steps. A handoff's KV is loaded into the batch's blocks: the request
        decodes in the batch. `prefill_only`: the request ends after its first token with a
        `HandedOff` record (its KV exported for a decode worker) instead of a `Finished`.
        `images`: their blocks of image tokens are in `prompt_ids` (`expand_image_placeholders`),
        in order; such requests run alone (the batch's runner has no vision tower).
        """
        if prefill_only and (params.is_beam_search or not params.use_kv_cache):
            raise ValueError("prefill/decode handoff needs use_kv_cache=True and num_beams=1")
        prompt_ids = self._check_prompt(prompt_ids)
        if handoff is None:
            self._check_images(prompt_ids, images, params)
        request_id = next(self._request_ids)
        if self.batcher is not None and self.batcher.accepts(params):
            if handoff is None:
                self.batcher.add(request_id, prompt_ids, params, prefill_only=prefill_only)
            else:
                self.batcher.add_handoff(request_id, handoff)
        elif prefill_only:
            self.alone.add(request_id, lambda is_cancelled: self._prefill_alone(prompt_ids, params, images))
        else:
            self.alone.add(
                request_id, lambda is_cancelled: self.generate(prompt_ids, params, is_cancelled, handoff, images)
            )
        return request_id

    def cancel(self, request_id: int) -> None:
        """The request ends with finish reason "cancelled" at its next step (unknown ids are ignored)."""
        if not (self.batcher is not None and self.batcher.cancel(request_id)):
            self.alone.cancel(request_id)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.alone) or (self.batcher is not None and self.batcher.has_unfinished)

    def waiting_request_ids(self) -> list[int]:
        """Requests queued for room in the batch, next first."""
        return [seq.seq_id for seq in self.batcher.scheduler.waiting] if self.batcher is not None else []

    def abort_all(self) -> None:
        """Forget every request (after a failed step, whose state cannot be trusted)."""
        self.alone.clear()
        if self.batcher is not None:
            self.batcher.abort_all()

    @property
    def last_batch_step(self) -> BatchStep | None:
        return self.batcher.last_step if self.batcher is not None else None

    def step(self) -> list[tuple[int, Event]]:
        """One step for every unfinished request: (request_id, event) pairs in order."""
        events = self.alone.step()
        if self.batcher is not None:
            events += self.batcher.step()
        return events

    # ---- generation ------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        should_cancel: ShouldCancel | None = None,
        handoff: Handoff | None = None,
        images: Sequence[PromptImage] = (),
    ) -> Iterator[Event]:
        """Yield `Prefilled`, one `Step` per token (`BeamStep`s under beam search), then one `Finished`.

        `should_cancel` is polled after every token (finish reason "cancelled"). With `handoff`
        the prefill already happened on another worker: its KV cache and first token are used.
        `images` go through the vision tower once, in the prefill (see `add_request`).
        """
        prompt_ids = self._check_prompt(prompt_ids)
        # a handoff's images were checked by the prefill worker; their spans come with its KV
        spans = self._check_images(prompt_ids, images, params) if handoff is None else ()
        if params.is_beam_search:
            for event in beam_search(
                self.model,
                prompt_ids,
                params,
                eos_token_ids=self.eos_token_ids,
                decode=self._decode_text,
                max_length=self.max_context,
                should_cancel=should_cancel,
            ):
                yield self._with_text_deltas(event) if isinstance(event, Finished) else event
            return
        if handoff is not None:
            run = self._resume(handoff)
            yield run.prefilled
            step = handoff.first_step
        else:
            run = self._new_run(prompt_ids, params, images=tuple(images), spans=spans)
            logits = self._prefill(run)
            yield run.prefilled
            step = self._sample_step(run, logits, "prefill", run.prefilled.prefill_ms)
        while True:
            finish_reason = self._finish_reason(run, step, should_cancel)
            if finish_reason:
                step = self._with_tail(run, step)
                yield step
                yield self._finish(run, finish_reason)
                return
            yield step
            t0 = time.perf_counter()
            logits = self._forward_next(run)
            step = self._sample_step(run, logits, "decode", (time.perf_counter() - t0) * 1000)

    def prefill_for_handoff(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[PromptImage] = ()
    ) -> Handoff:
        """Run only the prefill (and the first token) and package the KV cache for another worker
        (the images' KV travels with it; their pixels stay here)."""
        if params.is_beam_search or not params.use_kv_cache:
            raise ValueError("prefill/decode handoff needs use_kv_cache=True and num_beams=1")
        prompt_ids = self._check_prompt(prompt_ids)
        spans = self._check_images(prompt_ids, images, params)
        run = self._new_run(prompt_ids, params, images=tuple(images), spans=spans)
        logits = self._prefill(run)
        first = self._sample_step(run, logits, "prefill", run.prefilled.prefill_ms)
        layers = run.cache.export(len(prompt_ids))
        if params.use_prefix_cache:  # the conversation's next turn comes back to a prefill worker
            self._remember(run, layers)
        return Handoff(
            prompt_ids=prompt_ids,
            params=params,
            layers=layers,
            prefilled=run.prefilled,
            first_step=first,
            rng_state=run.sampler.generator.get_state(),
            seed=run.sampler.seed,
            ttft_ms=run.ttft_ms,
            image_spans=spans,
        )

    def _prefill_alone(
        self, prompt_ids: list[int], params: SamplingParams, images: Sequence[PromptImage] = ()
    ) -> Iterator[Event | HandedOff]:
        handoff = self.prefill_for_handoff(prompt_ids, params, images)
        yield from (handoff.prefilled, handoff.first_step, HandedOff(handoff))

    def export_handoff(self, handoff: Handoff) -> bytes:
        """The handoff as a blob for another worker (`inference.kv.transfer`'s format)."""
        return serialize(handoff, self.loaded.name)

    def import_handoff(self, blob: bytes | bytearray | memoryview) -> Handoff:
        """A blob from a prefill worker, verified against this engine's model and KV geometry
        (`KVTransferError` naming the defect), on this engine's device."""
        return deserialize(blob, KVSpec.from_model_info(self.model_info()), device=self.device)

    # ---- the loop's parts ------------------------------------------------------------

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise ValueError("prompt is empty: at least one token is needed")
        vocab = self.model.get_input_embeddings().weight.shape[0]
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        if len(ids) >= self.max_context:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's context is {self.max_context} "
                "(at least one token must be left to generate)"
            )
        return ids

    def _check_images(
        self, prompt_ids: list[int], images: Sequence[PromptImage], params: SamplingParams
    ) -> tuple[ImageSpan, ...]:
        """Where each image's tokens are; ValueError when the model takes no images, the prompt's
        image tokens do not match the images, or the request is a beam search."""
        if self.vision is None:
            if images:
                raise ValueError(f"model {self.loaded.name!r} takes no images (it has no vision tower)")
            return ()
        if images and params.is_beam_search:
            raise ValueError("beam search with images is not supported")
        hashes = [image.content_hash for image in images]
        return image_spans(prompt_ids, self.vision.image_token_id, self.vision.tokens_per_image, hashes)

    def _new_run(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        seed: int | None = None,
        with_cache: bool = True,
        images: tuple[PromptImage, ...] = (),
        spans: tuple[ImageSpan, ...] = (),
    ) -> _Run:
        """A request's state; `with_cache=False` for batched requests, whose KV is in the paged pool."""
        max_total = min(len(prompt_ids) + params.max_new_tokens, self.max_context)
        # On the model's device: the repetition penalty gathers logits (there) at these ids.
        context_ids = torch.zeros(max_total, dtype=torch.long, device=self.device)
        context_ids[: len(prompt_ids)] = torch.tensor(prompt_ids)
        sampler_params = params if seed is None else replace(params, seed=seed)
        return _Run(
            prompt_ids=prompt_ids,
            params=params,
            sampler=Sampler(sampler_params, self.device),
            cache=self.runner.new_cache(max_total) if params.use_kv_cache and with_cache else None,
            context_ids=context_ids,
            num_tokens=len(prompt_ids),
            detokenizer=IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True),
            stopper=StopStringMatcher(params.stop),
            thinking=ThinkingTracker(
                self.think_close_ids, params.max_thinking_tokens, is_open=self._opens_reasoning(prompt_ids)
            ),
            started_at=time.perf_counter(),
            images=images,
            image_spans=spans,
        )

    def _prefill(self, run: _Run) -> torch.Tensor:
        """One forward pass over the prompt (minus any prefix reused from the prefix cache)."""
        num_cached = 0
        if run.cache is not None and run.params.use_prefix_cache:
            # Keep at least the last prompt token to compute: its logits give the first token.
            num_cached, layers = self.prefix_cache.match(cache_key_ids(run.prompt_ids[:-1], run.image_spans))
            num_cached = cut_before_image(num_cached, run.image_spans)
            if num_cached:
                run.cache.load([(k[:, :num_cached], v[:, :num_cached]) for k, v in layers])
        t0 = time.perf_counter()
        ids = run.context_ids[num_cached : run.num_tokens]
        logits = self._forward(run, ids, run.cache, num_cached)  # (vocab,)
        prefill_ms = (time.perf_counter() - t0) * 1000
        run.prefilled = Prefilled(
            num_prompt_tokens=len(run.prompt_ids),
            num_cached_tokens=num_cached,
            num_prefilled_tokens=len(run.prompt_ids) - num_cached,
            prefill_ms=prefill_ms,
            kv_cache_bytes=self._kv_bytes(run),
        )
        return logits

    def _resume(self, handoff: Handoff, with_cache: bool = True) -> _Run:
        """The request's state after its first token, as the prefill worker left it (with its KV
        in a contiguous cache, or, `with_cache=False`, for the batcher to load into blocks)."""
        run = self._new_run(handoff.prompt_ids, handoff.params, seed=handoff.seed, with_cache=with_cache)
        if run.cache is not None:
            run.cache.load(handoff.layers)
        run.sampler.generator.set_state(handoff.rng_state)
        run.image_spans = handoff.image_spans  # the images' KV came with the handoff; they key the prefix cache
        run.prefilled = handoff.prefilled
        first = handoff.first_step
        if first.is_forced:
            run.thinking.forced_token()  # the prefill worker's budget forced it: take up the same state
        run.thinking.push(self.piece(first.token_id), is_forced=first.is_forced)
        self._append(run, handoff.first_step.token_id)
        run.text = run.stopper.feed(run.detokenizer.push(handoff.first_step.token_id))
        run.ttft_ms = handoff.ttft_ms
        return run

    def _forward_next(self, run: _Run) -> torch.Tensor:
        if run.cache is None:  # no-KV-cache mode: recompute every position (and image), every step
            return self._forward(run, run.context_ids[: run.num_tokens], None, 0)
        with self.routing.last_position() as routing:
            logits = self.runner.forward(run.context_ids[run.num_tokens - 1 : run.num_tokens], run.cache)
        run.moe_routing = tuple(routing) or None
        return logits

    def _forward(self, run: _Run, ids: torch.Tensor, cache: KVCache | None, start: int) -> torch.Tensor:
        """The runner's forward pass over `ids` (positions `start`...), with the pixels of the
        images whose tokens are among them: each image goes through the vision tower here.
        On a MoE model the pass's routing (of its last position) is kept for the step it produces."""
        images = [image for image, span in zip(run.images, run.image_spans) if span.start >= start]
        with self.routing.last_position() as routing:
            if not images:
                logits = self.runner.forward(ids, cache)
            else:
                pixel_values = self.vision.pixel_values(images, self.loaded.dtype, self.device)  # (n, 3, H, W)
                logits = self.runner.forward(ids, cache, pixel_values=pixel_values)
        run.moe_routing = tuple(routing) or None
        return logits

    def _sample_step(self, run: _Run, logits: torch.Tensor, phase: str, forward_ms: float) -> Step:
        t0 = time.perf_counter()
        forced_id = run.thinking.forced_token()
        # Sampled even when forced: the random stream then stays the one the same seed gives.
        out = run.sampler(logits[None], run.context_ids[None, : run.num_tokens])
        token_id = int(out.token_ids[0]) if forced_id is None else forced_id
        logprobs, raw_logprobs = out.logprobs[0], out.raw_logprobs[0]  # (vocab,)
        is_reasoning = run.thinking.push(self.piece(token_id), is_forced=forced_id is not None)
        self._append(run, token_id)
        delta = run.stopper.feed(run.detokenizer.push(token_id))
        run.text += delta
        k = run.params.num_alternatives
        top_raw = self._alternatives(raw_logprobs, k)
        step = Step(
            index=len(run.generated_ids) - 1,
            phase=phase,
            token_id=token_id,
            piece=self.piece(token_id),
            token_bytes=self.token_table.bytes_of(token_id),
            text_delta=delta,
            logprob=float(logprobs[token_id]),
            raw_logprob=float(raw_logprobs[token_id]),
            rank=token_rank(raw_logprobs, token_id),
            entropy=float(entropy(raw_logprobs[None])[0]),
            latency_ms=forward_ms + (time.perf_counter() - t0) * 1000,
            top_raw=top_raw,
            # No processor (greedy, temperature 1, no filters) samples the raw distribution itself.
            top_processed=top_raw if out.logprobs is out.raw_logprobs else self._alternatives(logprobs, k),
            kv_cache_bytes=self._kv_bytes(run),
            is_reasoning=is_reasoning,
            is_forced=forced_id is not None,
            moe_routing=run.moe_routing,
        )
        if phase == "prefill":
            run.ttft_ms = (time.perf_counter() - run.started_at) * 1000
        else:
            run.decode_ms += step.latency_ms
        return step

    def _append(self, run: _Run, token_id: int) -> None:
        run.generated_ids.append(token_id)
        if run.num_tokens < run.context_ids.shape[0]:
            run.context_ids[run.num_tokens] = token_id
        run.num_tokens += 1

    def _alternatives(self, logprobs: torch.Tensor, k: int) -> tuple[Alternative, ...]:
        if k == 0:
            return ()
        ids, lps = top_alternatives(logprobs, k)
        return tuple(
            Alternative(token_id=i, piece=self.piece(i), prob=math.exp(lp), logprob=lp) for i, lp in zip(ids, lps)
        )

    def _finish_reason(self, run: _Run, step: Step, should_cancel: ShouldCancel | None) -> str | None:
        if step.token_id in self.eos_token_ids and not run.params.ignore_eos:
            return "eos"
        if run.stopper.is_stopped:
            return "stop_string"
        if len(run.generated_ids) >= run.params.max_new_tokens:
            return "length"
        if run.num_tokens >= self.max_context:
            return "context"
        if should_cancel is not None and should_cancel():
            return "cancelled"
        return None

    def _with_tail(self, run: _Run, step: Step) -> Step:
        """Release text held back (a possible stop-string start, an unfinished UTF-8 char) on the last step."""
        tail = self._release_tail(run)
        return replace(step, text_delta=step.text_delta + tail) if tail else step

    def _release_tail(self, run: _Run) -> str:
        """The text held back so far, now added to the run's text (none once a stop string matched)."""
        tail = "" if run.stopper.is_stopped else run.stopper.feed(run.detokenizer.flush()) + run.stopper.flush()
        run.text += tail
        return tail

    def _finish(self, run: _Run, reason: str) -> Finished:
        num_decoded = max(len(run.generated_ids) - 1, 0)
        prefilled = run.prefilled
        if run.cache is not None and run.params.use_prefix_cache:
            self._remember(run, run.cache.export(run.cache.num_tokens))
        return Finished(
            finish_reason=reason,
            text=run.text,
            token_ids=tuple(run.generated_ids),
            num_prompt_tokens=len(run.prompt_ids),
            num_cached_tokens=prefilled.num_cached_tokens,
            num_generated_tokens=len(run.generated_ids),
            prefill_ms=prefilled.prefill_ms,
            ttft_ms=run.ttft_ms,
            decode_ms=run.decode_ms,
            decode_tok_s=num_decoded / (run.decode_ms / 1000) if run.decode_ms else 0.0,
            kv_cache_bytes=self._kv_bytes(run),
            queue_ms=prefilled.queue_ms,
            seed=run.sampler.seed,
            num_reasoning_tokens=run.thinking.num_reasoning_tokens,
            thinking_ended_by_budget=run.thinking.ended_by_budget,
        )

    def _kv_bytes(self, run: _Run) -> int:
        if run.cache is not None:
            return run.cache.nbytes
        return self.batcher.kv_bytes(run.seq) if run.seq is not None and self.batcher is not None else 0

    def _remember(self, run: _Run, layers: LayerKV) -> None:
        """Prompt and answer are the next turn's prompt: keep the KV the cache holds (all but the
        last token's, which was never computed) so the next chat turn prefills only its new tokens."""
        keep = run.cache.num_tokens
        if any(k.shape[1] != keep for k, _ in layers):  # a sliding-window cache forgot early positions
            self.num_not_cached_sliding_window += 1  # not reusable as a prefix: say so in the stats
            return
        self.prefix_cache.insert(cache_key_ids(run.context_ids[:keep].tolist(), run.image_spans), layers)

    def _with_text_deltas(self, finished: Finished) -> Finished:
        """Beam search's returned sequences with each token's share of their text, so a page
        can show them token by token as it shows sampled answers."""
        sequences = tuple(
            replace(beam, text_deltas=text_deltas(self.tokenizer, beam.token_ids, beam.text))
            for beam in finished.sequences
        )
        return replace(finished, sequences=sequences)

    def _decode_text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
