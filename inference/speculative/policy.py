"""How many proposed tokens a pass verifies: as many as pay for themselves, measured.

Owns: the cost of a decode step as a function of its tokens (a least-squares line through the
recent decode steps' times: on a CPU a step reads every weight once, the fixed part, and each
extra row adds its arithmetic), each request's acceptance rate (how often a proposed token was
the model's own choice), and the choice of k: the one that maximizes the step's tokens per
millisecond, counting every stream's tokens in it. A lone stream on a memory-bound step verifies
several tokens for little more than one; in a full, compute-bound batch extra rows cost what they
would give, k falls to 0, and the batch runs as without speculation.
Must not know: models, sampling, the batch's requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Until two step sizes are measured, an extra row is priced at this fraction of a one-row step:
# cautious for a CPU (8 rows of the default model's GGUF blocks cost ~2.4 one-row steps) so the
# first verifications measure the line rather than trust a guess.
PRIOR_ROW_FRACTION = 0.25
MAX_OBSERVED_STEPS = 64


class StepCost:
    """ms of a decode step of n tokens: `fixed_ms + per_token_ms * n`, fitted to recent steps."""

    def __init__(self) -> None:
        self.steps: deque[tuple[int, float]] = deque(maxlen=MAX_OBSERVED_STEPS)
        self._line: tuple[float, float] | None = None  # fitted once per step, read for every k tried

    def observe(self, num_tokens: int, forward_ms: float) -> None:
        """A decode step's tokens (proposed ones included) and forward time."""
        self.steps.append((num_tokens, forward_ms))
        self._line = None

    def line(self) -> tuple[float, float]:
        """(fixed_ms, per_token_ms) of the recent steps (the prior's slope until two sizes are seen)."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float]:
        if not self.steps:
            return 1.0, PRIOR_ROW_FRACTION
        sizes = [n for n, _ in self.steps]
        mean_n = sum(sizes) / len(sizes)
        mean_ms = sum(ms for _, ms in self.steps) / len(self.steps)
        spread = sum((n - mean_n) ** 2 for n in sizes)
        if spread == 0:
            per_token = PRIOR_ROW_FRACTION * mean_ms / (1 + PRIOR_ROW_FRACTION * (mean_n - 1))
        else:
            per_token = max(sum((n - mean_n) * (ms - mean_ms) for n, ms in self.steps) / spread, 0.0)
        return max(mean_ms - per_token * mean_n, 0.0), per_token

    def ms(self, num_tokens: int) -> float:
        fixed, per_token = self.line()
        return fixed + per_token * num_tokens


# What a kind of proposal is worth before it has been tried: a word-for-word prediction mostly
# holds; a lookup is as good as the length of the n-gram it matched (one token of context finds
# anything); a draft model's guesses, by its agreement with the model (measured from then on).
PRIOR_RATES = {"aligned": 0.8, "ngram4": 0.7, "ngram3": 0.6, "ngram2": 0.45, "ngram1": 0.3, "draft": 0.6}
PRIOR_WEIGHT = 2.0  # pseudo-observations the prior is worth
DECAY = 0.9  # weight of what was measured so far at each new pass: a text moves in and out of quoting
PROBE_EVERY = 8  # passes a request skips speculating before it tries one token again
# A k is taken only when it promises this much more than none: the cost line is measured on a
# machine whose other work moves step times, and a gain within that noise is no gain.
MIN_GAIN = 1.03


@dataclass
class Acceptance:
    """How often a request's proposed tokens were the model's choice, per kind of proposal
    (`Proposal.kind`), recent passes weighing most."""

    num_proposed: int = 0
    num_accepted: int = 0
    num_skipped: int = 0  # passes in a row without speculating
    counts: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind -> (accepted, rejections)

    def observe(self, kind: str, num_proposed: int, num_accepted: int) -> None:
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        accepted, rejections = self.counts.get(kind, (0.0, 0.0))
        self.counts[kind] = (DECAY * accepted + num_accepted, DECAY * rejections + (num_accepted < num_proposed))

    def rate(self, kind: str) -> float:
        """The chance the next proposed token of this kind is accepted, given the ones before were."""
        accepted, rejections = self.counts.get(kind, (0.0, 0.0))
        prior = PRIOR_RATES.get(kind, 0.5)
        return (accepted + PRIOR_WEIGHT * prior) / (accepted + rejections + PRIOR_WEIGHT)


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a pass verifying k proposed ones gives on average: the accepted run, plus the model's
    own token after it (1 + rate + rate^2 + ... + rate^k)."""
    return float(k + 1) if rate >= 1 else (1 - rate ** (k + 1)) / (1 - rate)


def choose_k(
    rate: float, max_k: int, cost: StepCost, num_step_tokens: int, num_step_yield: float, draft_ms: float = 0.0
) -> int:
    """The k in 0..max_k maximizing the step's tokens per ms. The step so far: `num_step_tokens`
    rows (every decode and the proposals already chosen) yielding `num_step_yield` tokens;
    `draft_ms`: what making each proposed token costs (a draft model's pass)."""
    best_k, best_rate = 0, MIN_GAIN * num_step_yield / max(cost.ms(num_step_tokens), 1e-6)
    for k in range(1, max_k + 1):
        step_ms = cost.ms(num_step_tokens + k) + k * draft_ms
        tokens_per_ms = (num_step_yield - 1 + expected_tokens(rate, k)) / max(step_ms, 1e-6)
        if tokens_per_ms > best_rate:
            best_k, best_rate = k, tokens_per_ms
    return best_k
