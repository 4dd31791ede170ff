"""Per-request generation settings (`SamplingParams`): the single source of truth.

Owns: every knob a user can turn for one request, its defaults and its validation
(`ValueError` naming the offending value). The Django `SamplingPreset` validates by
building this dataclass. Must not know: models, tensors, Django.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from inference.config import MAX_NUM_ALTERNATIVES
from inference.sampling import grammar_spec

MAX_STOP_STRINGS = 8
# Below this a temperature is greedy (stored as 0.0): the tempered distribution is one-hot to
# float32 anyway, and dividing logits by 1e-40 overflows them to inf, whose softmax is NaN
# (vLLM's threshold, `_SAMPLING_EPS`, is the same).
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
# The repetition penalty multiplies or divides logits: 1e-300 overflowed them to inf (a NaN
# distribution, which ended every request of the worker's batch). Values past these bounds only
# make the model repeat one token forever, or never again.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
# Seeds (given, or drawn when none is: see `Sampler`) stay within JavaScript's exact integers
# (Number.MAX_SAFE_INTEGER): a seed reported in JSON reads back the same in a browser, so a copied
# seed replays. 2**63 - 1 was allowed, and a drawn seed showed rounded ("8648170272581798000").
MAX_SEED = 2**53 - 1
# Settings of one request only, never a preset's (the admin's presets have a column per other field).
PER_REQUEST_FIELDS = ("grammar", "speculative", "num_speculative_tokens", "prediction")
# Speculative decoding (`inference.speculative`): what proposes the tokens a pass verifies.
SPECULATIVE_OFF, PROMPT_LOOKUP = "off", "prompt_lookup"  # any other value names a draft model
MAX_SPECULATIVE_TOKENS = 16  # proposed tokens one pass verifies at most (a verify pass is a small prefill)
MAX_PREDICTION_CHARS = 100_000


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    Greedy (argmax) when `greedy` is true or `temperature == 0` (a temperature below
    `MIN_TEMPERATURE` is stored as 0); otherwise random sampling from the processed
    distribution. Processor order (see `inference.sampling.logits`):
    repetition penalty -> temperature -> top-k -> top-p -> min-p.
    `top_k=0`, `top_p=1.0`, `min_p=0.0` and `repetition_penalty=1.0` mean "off".
    `penalize_prompt`: the repetition penalty counts the prompt's tokens too (transformers'
    default); False counts only the tokens this request generated (transformers'
    `prompt_ignore_length`), so quoting the question (a word to translate, a name in code) is
    not penalized while the answer's own loops are.
    `num_beams > 1` selects beam search (deterministic; sampling knobs then do not apply).
    `num_alternatives` is how many top tokens each step reports (raw and processed).
    `max_thinking_tokens`: after that many reasoning tokens (inside `<think>` ... `</think>`)
    the engine forces `</think>` and the answer follows; None = unlimited.
    `use_kv_cache=False` recomputes the whole sequence every step (same tokens, slower: shows what
    the cache saves); `use_prefix_cache=False` skips reusing KV from earlier requests.
    `grammar`: the answer must match it (`inference.sampling.grammar_spec`: a JSON object, a JSON
    Schema, tool calls); the grammar masks the processed distribution before the other processors,
    and a complete grammar ends the answer. None: free text.
    `speculative`: `off`, `prompt_lookup` (propose the continuation of the last n-gram where it
    appeared before in the prompt or the answer) or a draft model's name (a smaller model with the
    same tokenizer proposes); `prediction`: text the answer is expected to repeat much of (OpenAI's
    Predicted Outputs), proposed the same way. Proposed tokens are verified in one pass and kept
    only as far as the model itself would have chosen them: the answer is the same as without.
    `num_speculative_tokens`: how many a pass verifies at most; None: chosen per pass from the
    measured acceptance and step cost.
    """

    max_new_tokens: int = 256
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    penalize_prompt: bool = True
    seed: int | None = None
    num_alternatives: int = 10
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    use_kv_cache: bool = True
    use_prefix_cache: bool = True
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    num_return_sequences: int = 1
    max_thinking_tokens: int | None = None
    grammar: dict[str, Any] | None = None
    speculative: str = SPECULATIVE_OFF
    num_speculative_tokens: int | None = None
    prediction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, (list, tuple, str)):  # a dict would iterate its keys
            raise ValueError(f"stop={self.stop!r} must be a string or a list of strings")
        if isinstance(self.stop, (list, str)):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        _check_int("max_new_tokens", self.max_new_tokens, 1, 1_000_000)
        _check_float("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        _check_int("top_k", self.top_k, 0, 10_000_000)
        _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_float("min_p", self.min_p, 0.0, 1.0, high_open=True)
        _check_float("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        _check_int("num_alternatives", self.num_alternatives, 0, MAX_NUM_ALTERNATIVES)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop={s!r}: stop strings must be non-empty strings")
        _check_int("num_beams", self.num_beams, 1, 16)
        _check_float("length_penalty", self.length_penalty, -10.0, 10.0)
        _check_int("num_return_sequences", self.num_return_sequences, 1, self.num_beams)
        if self.max_thinking_tokens is not None:
            _check_int("max_thinking_tokens", self.max_thinking_tokens, 0, 1_000_000)
            if self.num_beams > 1:  # beams do not go through the per-token loop that forces the tag
                raise ValueError(f"max_thinking_tokens={self.max_thinking_tokens} does not apply to beam search")
        grammar_spec.check(self.grammar)
        if self.grammar is not None and self.num_beams > 1:
            raise ValueError("grammar does not apply to beam search (num_beams > 1)")
        self._check_speculation()
        for name in ("greedy", "penalize_prompt", "ignore_eos", "use_kv_cache", "use_prefix_cache", "early_stopping"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")

    def _check_speculation(self) -> None:
        if not isinstance(self.speculative, str) or not self.speculative.strip() or len(self.speculative) > 200:
            raise ValueError(f"speculative={self.speculative!r} must be 'off', 'prompt_lookup' or a draft model's name")
        if self.num_speculative_tokens is not None:
            _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        if self.prediction is not None:
            if not isinstance(self.prediction, str):
                raise ValueError(f"prediction={self.prediction!r} must be a string")
            if len(self.prediction) > MAX_PREDICTION_CHARS:
                raise ValueError(f"prediction has {len(self.prediction)} characters; at most {MAX_PREDICTION_CHARS}")
        if self.is_speculative and self.num_beams > 1:
            raise ValueError("speculative decoding and prediction do not apply to beam search (num_beams > 1)")
        if self.is_speculative and not self.use_kv_cache:
            raise ValueError("speculative decoding and prediction need the KV cache (use_kv_cache=false)")

    @property
    def is_speculative(self) -> bool:
        """Whether something proposes tokens for this request's passes to verify."""
        return self.speculative != SPECULATIVE_OFF or bool(self.prediction)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @staticmethod
    def resolve_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
        """`overrides` of a preset's settings as they apply, by the one rule every client follows:
        a `temperature` asks for sampling even under a greedy preset (as in the OpenAI API;
        temperature 0 is still greedy), unless `greedy` is overridden too. So `greedy` is in the
        result whenever the client chose how to decode."""
        if "temperature" in overrides and "greedy" not in overrides:
            return {**overrides, "greedy": False}
        return overrides

    @property
    def is_beam_search(self) -> bool:
        return self.num_beams > 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        """Build from user input (JSON); unknown keys are a ValueError naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown sampling setting(s): {', '.join(unknown)}")
        return cls(**data)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an integer")
    if not low <= value <= high:
        raise ValueError(f"{name}={value} must be between {low} and {high}")


def _check_float(
    name: str, value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name}={value} must be in {lo}{low}, {high}{hi}")
