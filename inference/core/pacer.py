"""How many tokens the next step may batch so that a step which prefills stays near a time goal.

Owns: the measured cost of a step as a fixed part (what a step without prefill costs: its decode
rows, the pass's own overhead) plus a cost per prefilled token, and the token budget they give for
`max_step_ms`. A step cannot be interrupted, so whoever arrives waits for the one in flight and then
for their own: with steps near `max_step_ms`, a newcomer's first token comes within about two of
them, and every running answer gets a token at least that often, however long the prompts beside
them (a 512-token chunk of a 0.5B model takes ~5 s on a 2-core CPU; the budget then falls to ~40).
The fixed part is kept apart because a small step is mostly that: on matrix units (AMX, GPUs) one
row costs what eight do, and a 40-token prompt priced per token made a step of 280 look too long
(eight chat prompts arriving together were split over two steps, their first tokens one step later).
Plain bookkeeping: the engine core feeds it each step's size and time.
Must not know: requests, clients, the model.
"""

from __future__ import annotations

MIN_SAMPLE_TOKENS = 64  # smaller prefills say little about a token's cost beside the fixed part
SMOOTHING = 0.3  # weight of the newest step in the running averages (costs drift with context)
BUDGET_BOUND = 0.9  # a step this full of its token budget was cut by it (a chunk of a longer prompt)


class StepPacer:
    def __init__(self, max_step_ms: float | None, max_num_batched_tokens: int) -> None:
        if max_step_ms is not None and max_step_ms <= 0:
            raise ValueError(f"max_step_ms={max_step_ms} must be > 0 (or None: no time goal)")
        self.max_step_ms = max_step_ms
        self.max_num_batched_tokens = max_num_batched_tokens
        self.fixed_ms = 0.0  # a step without prefill, averaged over recent ones
        self.average_ms = 0.0  # a prefilled token's cost beyond the fixed part, averaged over recent steps
        self.ms_per_token: float | None = None  # the cost the budget assumes; None until measured
        self.last_budget = max_num_batched_tokens  # what `token_budget` gave last

    def observe(self, num_tokens: int, forward_ms: float, is_prefill: bool = True) -> None:
        """One step's size, the time of its forward pass, and whether it prefilled."""
        if not is_prefill:
            previous = forward_ms if self.fixed_ms == 0.0 else self.fixed_ms
            self.fixed_ms = (1 - SMOOTHING) * previous + SMOOTHING * forward_ms
            return
        if num_tokens < MIN_SAMPLE_TOKENS:
            return
        cost = max(forward_ms - self.fixed_ms, 0.0) / num_tokens
        previous = cost if self.ms_per_token is None else self.average_ms
        self.average_ms = (1 - SMOOTHING) * previous + SMOOTHING * cost
        # A step its budget bounded (a long prompt's chunk) is priced at the larger of the average
        # and the latest: its tokens cost more as the context grows, and an average alone lags
        # behind that growth (steps then overran the goal). A step the budget did not bound (a few
        # chat prompts arriving together, the first often alone and slowed by what runs beside
        # the engine) says nothing of that growth and only joins the average: priced at its own
        # cost, the next burst of eight prompts was split over two steps.
        is_budget_bound = num_tokens >= BUDGET_BOUND * self.last_budget
        self.ms_per_token = max(self.average_ms, cost) if is_budget_bound else self.average_ms

    def token_budget(self) -> int:
        """Tokens the next step may batch: the configured maximum, or fewer to stay near the goal."""
        self.last_budget = self.max_num_batched_tokens
        if self.max_step_ms is not None and self.ms_per_token:
            room_ms = self.max_step_ms - self.fixed_ms
            self.last_budget = max(1, min(self.max_num_batched_tokens, int(room_ms / self.ms_per_token)))
        return self.last_budget
