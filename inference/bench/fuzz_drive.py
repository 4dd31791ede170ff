"""The differential fuzz's fuzzed side: one engine, the cases arriving between its steps.

Owns: feeding cases to the engine as the worker's loop would (requests added between steps, n
choices, beams, PD handoffs prefilled on a second engine and imported through the blob format,
cancels once a stream has its tokens, inspections run on the loop with their passes stepping the
batch between chunks as `ServeLoop` makes them, a second model loaded and dropped), collecting
each stream's events and each inspection's tensor, and which steps each case was live for (what
ran beside a mismatch). Must not know: the reference, comparisons, the report.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from inference.bench.fuzz_cases import Case
from inference.bench.fuzz_subjects import Subject
from inference.engine import Engine
from inference.events import BeamStep, Finished, Step

MAX_DEFERRALS = 200  # an inspection the pool has no room for is retried at the next steps, then given up
MAX_STEPS = 200_000


@dataclass
class Observed:
    """What the fuzzed engine gave for each case."""

    streams: dict[int, list[list[Any]]] = field(default_factory=dict)  # case index -> each choice's events
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)  # inspection case index -> its output
    errors: dict[int, str] = field(default_factory=dict)  # case index -> what raised
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # case index -> (first, last) live step
    given_up: list[int] = field(default_factory=list)  # inspections never given room
    num_steps: int = 0


def tokens_of(events: list[Any]) -> int:
    return sum(isinstance(e, (Step, BeamStep)) for e in events)


class Drive:
    def __init__(self, subject: Subject, engine: Engine, prefill_engine: Engine) -> None:
        self.subject, self.engine, self.prefill_engine = subject, engine, prefill_engine
        self.observed = Observed()
        self.queue: deque[Case] = deque()
        self.owner: dict[int, tuple[int, int]] = {}  # request id -> (case index, choice)
        self.ids: dict[int, list[int]] = {}  # case index -> its request ids
        self.to_cancel: dict[int, Case] = {}
        self.deferrals: dict[int, int] = {}

    def run(self, cases: list[Case]) -> Observed:
        self.queue.extend(sorted(cases, key=lambda c: c.arrive_at))
        self.engine.passes.pace = lambda: self._tick(nested=True)  # as the worker's loop: a step per chunk
        while self.queue or self.engine.has_unfinished:
            self._tick(nested=False)
            if self.observed.num_steps > MAX_STEPS:
                raise RuntimeError(f"the fuzzed engine has not finished after {MAX_STEPS} steps")
        return self.observed

    def _tick(self, nested: bool) -> None:
        """Arrivals (not an inspection inside another's pass: the loop runs one at a time), one
        step of the batch, its events, then the cancels it made due."""
        while self.queue and self.queue[0].arrive_at <= self.observed.num_steps:
            case = self.queue[0]
            if nested and (case.is_inspection or case.kind == "switch"):
                break
            self.queue.popleft()
            if not self._start(case):
                break
        for request_id, event in self.engine.step():
            index, choice = self.owner[request_id]
            self.observed.streams[index][choice].append(event)
            if isinstance(event, Finished):
                self._live(index)
        self._cancel_due()
        self.observed.num_steps += 1

    def _start(self, case: Case) -> bool:
        """Adds or runs the case; False when an inspection found no room and waits."""
        self._live(case.index)
        try:
            if case.is_inspection or case.kind == "switch":
                return self._inspect(case)
            self._add(case)
        except Exception as exc:  # a refusal or a failure is the case's result
            self.observed.errors[case.index] = f"{type(exc).__name__}: {exc}"
        return True

    def _add(self, case: Case) -> None:
        engine, prompt, client = self.engine, list(case.prompt_ids), case.client
        if case.kind == "choices":
            ids = engine.add_choices(prompt, case.params, case.num_choices, client=client)
        elif case.kind == "handoff":  # prefilled by "another worker", its KV through the blob format
            handoff = self.prefill_engine.prefill_for_handoff(prompt, case.params)
            blob = self.prefill_engine.export_handoff(handoff)
            ids = [engine.add_request(prompt, case.params, handoff=engine.import_handoff(blob), client=client)]
        else:
            ids = [engine.add_request(prompt, case.params, client=client)]
        self.ids[case.index] = ids
        self.observed.streams[case.index] = [[] for _ in ids]
        for choice, request_id in enumerate(ids):
            self.owner[request_id] = (case.index, choice)
        if case.cancel_after is not None:
            self.to_cancel[case.index] = case
            self._cancel_due()

    def _inspect(self, case: Case) -> bool:
        passes, prompt = self.engine.passes, list(case.prompt_ids)
        try:
            if case.kind == "teacher_force":
                out = passes.teacher_force(prompt, list(case.answer_ids))
            elif case.kind == "score":
                parts: list[torch.Tensor] = []
                passes.score(prompt, lambda start, logits: parts.append(logits.clone()), max_rows=16)
                out = torch.cat(parts)
            elif case.kind == "lens":
                out = passes.read_layers(prompt)
            else:
                self.subject.switch(case.index, prompt)
                return True
        except ValueError as exc:
            if "no room" not in str(exc):
                raise
            return self._defer(case)
        self.observed.tensors[case.index] = out
        self._live(case.index)
        return True

    def _defer(self, case: Case) -> bool:
        self.deferrals[case.index] = self.deferrals.get(case.index, 0) + 1
        if self.deferrals[case.index] > MAX_DEFERRALS:
            self.observed.given_up.append(case.index)
            return True
        self.queue.appendleft(replace(case, arrive_at=self.observed.num_steps + 1))
        return False

    def _cancel_due(self) -> None:
        for index, case in list(self.to_cancel.items()):
            if tokens_of(self.observed.streams[index][0]) >= case.cancel_after:
                for request_id in self.ids[index]:
                    self.engine.cancel(request_id)
                del self.to_cancel[index]

    def _live(self, index: int) -> None:
        first, _ = self.observed.spans.get(index, (self.observed.num_steps, 0))
        self.observed.spans[index] = (first, self.observed.num_steps)
