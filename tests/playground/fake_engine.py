"""A stand-in for `inference.engine.Engine` with the same API and canned records.

One token per character (id = code point); a chat is rendered with a real ChatML template;
`generate` yields Prefilled, one Step per character of `answer`, then Finished, polling
`should_cancel` after every step like the real engine. No torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from inference.events import (
    Alternative,
    Beam,
    BeamStep,
    Event,
    Finished,
    Prefilled,
    ProposedToken,
    Step,
    Verification,
)
from inference.model_info import ModelInfo
from inference.sampling_params import SamplingParams
from inference.text.chat_template import RenderedPrompt, Span, render_chat
from inference.text.prompt import Prompt, PromptError
from inference.text.tokenization import TokenInfo
from playground.worker import generation

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML the way DeepSeek-R1's template treats reasoning: earlier answers lose everything up to
# their `</think>`, and the prompt opens a `<think>` block for the new answer.
R1_CHATML = (
    "{% for m in messages %}{% set content = m.content %}"
    "{% if m.role == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


class FakePrompts:
    """`PromptBuilder`'s surface: one token per character, ChatML unless a template is given."""

    vision = None  # a text-only model: it takes no images

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def render_chat(
        self, messages: list[dict], template: str | None = None, add_generation_prompt: bool = True
    ) -> RenderedPrompt:
        self.engine.rendered.append((messages, template))
        return render_chat(messages, template or CHATML, add_generation_prompt=add_generation_prompt)

    def token_infos(self, token_ids: Sequence[int]) -> list[TokenInfo]:
        return [TokenInfo(i, chr(i), chr(i).encode(), False) for i in token_ids]

    def tokenize(self, text: str) -> list[TokenInfo]:
        return self.token_infos([ord(c) for c in text])

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def piece(self, token_id: int) -> str:
        return chr(token_id)

    def with_image_placeholders(self, text: str, num_images: int) -> str:
        return text

    def build(self, *, messages=None, text="", template=None, extra_token_ids=(), images=()) -> Prompt:
        if images:
            raise PromptError("images_not_supported", "model 'fake' takes no images")
        spans: tuple[Span, ...] = (Span(0, len(text), "content", None),) if text else ()
        dropped: tuple[int, ...] = ()
        if messages is not None:
            try:
                rendered = self.render_chat(messages, template)
            except ValueError as exc:
                raise PromptError("invalid_params", f"the prompt could not be built: {exc}") from exc
            text, spans, dropped = rendered.text, rendered.spans, rendered.dropped_reasoning
        bad = [i for i in extra_token_ids if not 0 <= i < 0x110000]
        if bad:
            raise PromptError("invalid_params", f"token id {bad[0]} is outside the vocabulary (0..{0x110000 - 1})")
        tokens = tuple(self.tokenize(text) + self.token_infos(extra_token_ids))
        return Prompt(text, tuple(spans), tokens, dropped_reasoning=dropped)


class FakeEngine:
    device = torch.device("cpu")
    loaded = SimpleNamespace(dtype=torch.float32)  # what the metrics read of a real engine's LoadedModel

    def __init__(
        self,
        answer: str = "Hello there, friend!",
        max_context: int = 2048,
        fail_after: int | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.answer = answer
        self.max_context = max_context
        self.fail_after = fail_after  # raise RuntimeError after this many steps
        self.on_step = on_step  # called with each step's index before it is yielded
        self.prompt_ids: list[int] | None = None
        self.rendered: list[tuple[list[dict], str | None]] = []
        self.prompts = FakePrompts(self)
        self._events: dict[int, Iterator[Event]] = {}  # every request runs alone, one event per step
        # The draft models it has (`speculative` names one), where the engine keeps them.
        self.core = SimpleNamespace(speculator=SimpleNamespace(drafts={}))
        self._cancelled: set[int] = set()

    @property
    def info(self) -> ModelInfo:  # computed: tests change max_context
        return ModelInfo(
            name="fake",
            architecture="Fake",
            model_type="fake",
            num_params=1,
            weight_bytes=4,
            num_layers=1,
            hidden_size=1,
            vocab_size=0x110000,
            dtype="float32",
            precision="float32",
            quantization=None,
            device="cpu",
            max_context=self.max_context,
            eos_token_ids=[0],
            kv_bytes_per_token=16,
            runner="fake",
            kernels="torch ops",
            batch_invariant=False,
            has_chat_template=True,
            sliding_window=None,
            num_moe_layers=0,
            moe=None,
            vision=None,
        )

    def model_info(self) -> dict[str, Any]:
        return self.info.to_dict()

    def prefix_cache_stats(self) -> dict[str, Any]:
        return {"hits": 0, "misses": 1, "hit_rate": 0.0, "num_stored_blocks": 0, "num_bytes": 0, "num_evictions": 0}

    def stats(self) -> dict[str, Any]:
        blocks = {"num_blocks": 1, "num_used_blocks": 0, "block_size": 1, "num_hit_tokens": 0, "num_queried_tokens": 0}
        return {
            "num_running": len(self._events),
            "num_waiting": 0,
            "num_steps": 0,
            "num_preemptions": 0,
            "blocks": blocks,
            "prefix_cache": self.prefix_cache_stats(),
        }

    # The engine's many-requests API: every request runs alone, one event per step.
    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        handoff: Any = None,
        prefill_only: bool = False,
        images: Sequence[Any] = (),
        client: str = "",
    ) -> int:
        if prefill_only:
            raise ValueError("the fake engine has no KV cache to hand off")
        drafts = sorted(self.core.speculator.drafts)
        if params.speculative not in ("off", "prompt_lookup", *drafts):  # the engine's own check
            known = ", ".join(["off", "prompt_lookup", *drafts])
            raise ValueError(f"speculative={params.speculative!r} is not a draft model of this engine ({known})")
        request_id = self.num_requests = getattr(self, "num_requests", 0) + 1
        self._events[request_id] = self.generate(prompt_ids, params, lambda: request_id in self._cancelled)
        return request_id

    def attach_draft(self, loaded: Any) -> None:
        self.core.speculator.drafts[loaded.name] = loaded

    def add_choices(
        self, prompt_ids: Sequence[int], params: SamplingParams, num_choices: int, images=(), client: str = ""
    ) -> list[int]:
        """Each choice alone (the fake has no KV cache to share), seeded seed, seed + 1, ..."""
        seeds = [None if params.seed is None else params.seed + i for i in range(num_choices)]
        return [self.add_request(prompt_ids, replace(params, seed=seed), client=client) for seed in seeds]

    def cancel(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    @property
    def has_unfinished(self) -> bool:
        return bool(self._events)

    def step(self) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = []
        for request_id, request_events in list(self._events.items()):
            event = next(request_events, None)
            if event is not None:
                events.append((request_id, event))
            if event is None or isinstance(event, Finished):
                del self._events[request_id]
        return events

    def waiting_request_ids(self) -> list[int]:
        return []

    def abort_all(self) -> None:
        self._events.clear()

    last_batch_step = None
    vision = None  # a text-only model: it takes no images

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, should_cancel: Callable[[], bool] | None = None
    ) -> Iterator[Event]:
        self.prompt_ids = list(prompt_ids)
        yield Prefilled(
            num_prompt_tokens=len(prompt_ids),
            num_cached_tokens=0,
            num_prefilled_tokens=len(prompt_ids),
            prefill_ms=5.0,
            kv_cache_bytes=100,
        )
        text, reason = "", "length"
        num_proposed = num_accepted = 0
        for index, char in enumerate(self.answer[: params.max_new_tokens]):
            if index == self.fail_after:
                raise RuntimeError("the fake model broke")
            if self.on_step:
                self.on_step(index)
            text += char
            if params.is_beam_search:
                beam = Beam(token_ids=tuple(ord(c) for c in text), text=text, score=-0.5, parent=0)
                yield BeamStep(index=index, phase="decode", beams=(beam,), latency_ms=1.0)
            else:
                alternative = Alternative(token_id=ord(char), piece=char, prob=1.0, logprob=0.0)
                verification = _verification(params, index, char)
                if verification is not None:
                    num_proposed += len(verification.proposed)
                    num_accepted += verification.num_accepted
                filtered = Alternative(token_id=1, piece="\x01", prob=0.0, logprob=float("-inf"))
                yield Step(
                    index=index,
                    phase="prefill" if index == 0 else "decode",
                    token_id=ord(char),
                    piece=char,
                    token_bytes=char.encode(),
                    text_delta=char,
                    logprob=0.0,
                    raw_logprob=-0.1,
                    rank=1,
                    entropy=0.2,
                    latency_ms=1.0,
                    top_raw=(alternative,),
                    top_processed=(alternative, filtered),
                    kv_cache_bytes=100,
                    verification=verification,
                )
            if should_cancel is not None and should_cancel():
                reason = "cancelled"
                break
        num_generated = len(text)
        yield Finished(
            finish_reason=reason,
            text=text,
            token_ids=tuple(ord(c) for c in text),
            num_prompt_tokens=len(prompt_ids),
            num_cached_tokens=0,
            num_generated_tokens=num_generated,
            prefill_ms=5.0,
            ttft_ms=6.0,
            decode_ms=float(num_generated),
            decode_tok_s=1000.0,
            kv_cache_bytes=100,
            num_proposed_tokens=num_proposed,
            num_accepted_tokens=num_accepted,
            speculative_speedup=1.5 if params.is_speculative else 1.0,
        )


def _verification(params: SamplingParams, index: int, char: str) -> Verification | None:
    """A speculating request's decode steps each verify one proposed token: the prediction's
    character there (the answer's own with `speculative` and no prediction), accepted when it
    is the answer's."""
    if not params.is_speculative or index == 0:
        return None
    if params.prediction:
        if index >= len(params.prediction):
            return None
        guess, source = params.prediction[index], "prediction"
    else:
        guess, source = char, params.speculative
    is_accepted = guess == char
    proposed = ProposedToken(ord(guess), guess, 1.0, 1.0 if is_accepted else 0.0, is_accepted)
    return Verification(source, (proposed,), int(is_accepted), 0 if is_accepted else 1)


def run_on_a_thread(generation_id: int, engine: FakeEngine, steps_run: list[int]) -> tuple[threading.Thread, list]:
    """Runs the generation on a thread of its own (as a worker's pool does) and returns once
    `engine` has stepped it five times (`steps_run`: what the engine's `on_step` appends to);
    the thread and the events it sends."""
    events: list[dict[str, Any]] = []
    running = threading.Thread(
        target=generation.run_generation,
        args=(generation_id, "worker-1"),
        kwargs={"load_engine": lambda model: engine, "send": events.append},
    )
    running.start()
    deadline = time.monotonic() + 30
    while len(steps_run) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    return running, events
