"""A stand-in for `inference.engine.Engine` with the same API and canned records.

One token per character (id = code point); a chat is rendered with a real ChatML template;
`generate` yields Prefilled, one Step per character of `answer`, then Finished, polling
`should_cancel` after every step like the real engine. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from inference.alone import AloneRequests
from inference.events import Alternative, Beam, BeamStep, Event, Finished, Prefilled, Step
from inference.sampling_params import SamplingParams
from inference.text.chat_template import RenderedPrompt, render_chat
from inference.text.tokenization import TokenInfo

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


class _NoBosTokenizer:
    """What `bos_for_raw_text` reads of a tokenizer: this one has no BOS to put before raw text."""

    bos_token_id = None


class FakeEngine:
    tokenizer = _NoBosTokenizer()

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
        self.alone = AloneRequests()

    def model_info(self) -> dict[str, Any]:
        return {
            "name": "fake",
            "architecture": "Fake",
            "num_params": 1,
            "num_layers": 1,
            "vocab_size": 0x110000,
            "dtype": "float32",
            "device": "cpu",
            "max_context": self.max_context,
            "eos_token_ids": [0],
            "kv_bytes_per_token": 16,
        }

    def prefix_cache_stats(self, params: SamplingParams | None = None) -> dict[str, Any]:
        return {"hits": 0, "misses": 1, "hit_rate": 0.0, "num_entries": 0, "num_bytes": 0, "num_evictions": 0}

    def render_chat(
        self, messages: list[dict], template: str | None = None, add_generation_prompt: bool = True
    ) -> RenderedPrompt:
        self.rendered.append((messages, template))
        return render_chat(messages, template or CHATML, add_generation_prompt=add_generation_prompt)

    def token_infos(self, token_ids: Sequence[int]) -> list[TokenInfo]:
        return [TokenInfo(i, chr(i), chr(i).encode(), False) for i in token_ids]

    def tokenize(self, text: str) -> list[TokenInfo]:
        return self.token_infos([ord(c) for c in text])

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    # The engine's many-requests API: every request runs alone, one event per step.
    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        handoff: Any = None,
        prefill_only: bool = False,
        images: Sequence[Any] = (),
    ) -> int:
        if prefill_only:
            raise ValueError("the fake engine has no KV cache to hand off")
        self.num_requests = getattr(self, "num_requests", 0) + 1
        self.alone.add(self.num_requests, lambda is_cancelled: self.generate(prompt_ids, params, is_cancelled))
        return self.num_requests

    def cancel(self, request_id: int) -> None:
        self.alone.cancel(request_id)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.alone)

    def step(self) -> list[tuple[int, Event]]:
        return self.alone.step()

    def waiting_request_ids(self) -> list[int]:
        return []

    def abort_all(self) -> None:
        self.alone.clear()

    last_batch_step = None
    batcher = None  # no batched path: every request runs alone
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
        )
