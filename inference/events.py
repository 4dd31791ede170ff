"""The records a generation yields, in order: `Prefilled`, then one `Step` per token,
then exactly one `Finished`. Beam search yields `BeamStep`s and then `Finished`.

Owns: the shape of what the engine reports. Plain data (JSON-ready via `to_dict`), no
tensors, so records cross process boundaries (Celery, Channels) unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Phase = Literal["prefill", "decode"]
FinishReason = Literal["eos", "grammar", "length", "stop_string", "context", "cancelled", "error"]


@dataclass(frozen=True)
class Alternative:
    """One candidate next token: its id, its text alone, and its probability."""

    token_id: int
    piece: str  # the token decoded alone (may hold U+FFFD for a partial UTF-8 byte)
    prob: float
    logprob: float


@dataclass(frozen=True)
class ProposedToken:
    """A token proposed for a verification pass (speculative decoding)."""

    token_id: int
    piece: str
    draft_prob: float  # the proposer's probability of it (1.0: a lookup's guess)
    prob: float | None  # the model's (processed) probability of it there; None: past the first rejection, not reached
    is_accepted: bool


@dataclass(frozen=True)
class Verification:
    """The pass a token came out of when it verified proposed tokens: what was proposed, how many
    the model agreed with (the first `num_accepted`), and this token's place among the pass's
    tokens (`position` == `num_accepted`: the model's own token, after the accepted run)."""

    source: str  # "prompt_lookup", "prediction" or the draft model's name
    proposed: tuple[ProposedToken, ...]
    num_accepted: int
    position: int


@dataclass(frozen=True)
class Prefilled:
    """The prompt went through the model once; the KV cache now holds it."""

    num_prompt_tokens: int
    num_cached_tokens: int  # reused from the prefix cache, not recomputed
    num_prefilled_tokens: int  # actually run through the model in this request
    prefill_ms: float
    kv_cache_bytes: int
    queue_ms: float = 0.0  # arrival -> first scheduled (waiting for a place in the batch)
    type: str = "prefilled"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Step:
    """One generated token and the distribution it was drawn from.

    `top_raw` is the model's own softmax(logits); `top_processed` is the distribution the
    token was actually sampled from (after penalty, temperature, top-k/p, min-p).
    `logprob` is the chosen token's log-probability under the processed distribution,
    `raw_logprob` under the raw one; `rank` is its 1-based rank in the raw distribution.
    The first token comes out of the prefill forward pass, so its phase is "prefill".
    `is_reasoning`: generated inside a `<think>` block (`inference.sampling.thinking`'s rule);
    `is_forced`: the thinking budget chose the token (`</think>` or a piece of it), not the
    sampler; the model still ran and the distributions are the ones it gave.
    `masked_prob` (a request with a grammar; None without): the mass of the raw distribution the
    grammar removed; `top_masked`: which of `top_raw` it removed (the rest of that mass lies
    beyond the listed alternatives).
    `verification` (speculative decoding): the pass that gave this token verified proposed
    tokens; its `latency_ms` is then the pass's time shared by the tokens it gave.
    `moe_routing` (mixture-of-experts models only; None on a dense model): each MoE layer's
    choice in the forward pass that produced this token, for the position it was predicted
    from: {"layer", "experts" (descending weight), "weights", "groups"}
    (`inference.introspect.moe.choice_at`).
    """

    index: int
    phase: Phase
    token_id: int
    piece: str
    token_bytes: bytes
    text_delta: str  # UTF-8-safe increment of the decoded answer
    logprob: float
    raw_logprob: float
    rank: int
    entropy: float  # of the raw distribution, in nats
    latency_ms: float
    top_raw: tuple[Alternative, ...] = ()
    top_processed: tuple[Alternative, ...] = ()
    kv_cache_bytes: int = 0
    is_reasoning: bool = False
    is_forced: bool = False
    moe_routing: tuple[dict[str, Any], ...] | None = None
    masked_prob: float | None = None  # the raw distribution's mass the request's grammar removed; None: no grammar
    top_masked: tuple[Alternative, ...] = ()  # the alternatives of `top_raw` the grammar removed (raw probabilities)
    verification: Verification | None = None  # the pass verified proposed tokens (speculative decoding)
    type: str = "step"

    def to_dict(self) -> dict[str, Any]:
        # Built by hand, not with `asdict`, which copies field by field recursively: 160 us for a
        # step with 2 x 20 alternatives, paid by every token a worker serves (this: ~6 us).
        d = dict(self.__dict__)
        d["token_bytes"] = self.token_bytes.hex()
        d["top_raw"] = tuple(dict(a.__dict__) for a in self.top_raw)
        d["top_processed"] = tuple(dict(a.__dict__) for a in self.top_processed)
        d["top_masked"] = tuple(dict(a.__dict__) for a in self.top_masked)
        if self.moe_routing is not None:
            d["moe_routing"] = tuple(_copied(choice) for choice in self.moe_routing)
        if self.verification is not None:
            d["verification"] = asdict(self.verification)
        return d


def _copied(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a flat record whose values are lists or scalars (what `asdict` gave)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in record.items()}


@dataclass(frozen=True)
class Beam:
    """One beam-search path. `token_logprobs[i]` is token i's log-probability as the search
    scored it (the model's log-softmax, after the repetition penalty when one is set), so
    `score == sum(token_logprobs) / len ** length_penalty`. `text_deltas` (each token's share
    of `text`, as `Step.text_delta`) is filled on `Finished.sequences` only."""

    token_ids: tuple[int, ...]  # generated tokens only (prompt excluded)
    text: str
    score: float  # sum of logprobs / len ** length_penalty
    parent: int  # index of this beam's parent in the previous BeamStep
    is_finished: bool = False
    token_logprobs: tuple[float, ...] = ()
    text_deltas: tuple[str, ...] = ()


@dataclass(frozen=True)
class BeamStep:
    """The live beams after one beam-search step (for a beam-tree view)."""

    index: int
    phase: Phase
    beams: tuple[Beam, ...]
    latency_ms: float
    type: str = "beam_step"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finished:
    """The single terminal record of every generation."""

    finish_reason: FinishReason
    text: str
    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    prefill_ms: float
    ttft_ms: float  # request start -> first token available (queue time included)
    decode_ms: float
    decode_tok_s: float
    kv_cache_bytes: int
    queue_ms: float = 0.0
    seed: int | None = None  # the sampler's seed (drawn when the request gave none): replays the run
    num_reasoning_tokens: int = 0  # steps with is_reasoning
    thinking_ended_by_budget: bool = False  # max_thinking_tokens forced a `</think>`
    sequences: tuple[Beam, ...] = ()  # beam search: the returned sequences, best first
    error: str | None = None
    # Speculative decoding: tokens proposed and accepted (the answer is the same as without), and
    # the estimated speedup of its decode (what its tokens would have cost as plain steps, by the
    # measured step-cost line, over what they did); 1.0 without speculation.
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
    speculative_speedup: float = 1.0
    type: str = "finished"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Event = Prefilled | Step | BeamStep | Finished
