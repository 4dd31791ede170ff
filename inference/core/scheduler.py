"""What runs in the next step: continuous batching under a token budget (vLLM v1's shape).

Each step the scheduler picks, within `max_num_batched_tokens` tokens and `max_num_seqs`
sequences: first the running sequences' decodes (one token each, so time between tokens
stays short); then, when several clients have prompts to prefill, a chunk of an equal share
of the rest for each client (so one client's long prompts cannot hold another's first token);
then the next prefill chunks of running sequences, then new sequences from the waiting queue,
in arrival order. A long prompt is split across steps (chunked prefill) and
shares each step with the decodes. When a running sequence needs a KV block and none is
free, the newest running sequence is preempted: its blocks are freed and it goes back to the
front of the queue, to recompute its tokens later (its full blocks may still be in the
prefix cache then). Sequences of a group (beam search's beams) are preempted and admitted
together. A sequence with nothing to compute (a beam waiting for its group) sits out the step.
Must not know: tensors, models, sampling.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inference.core.block_manager import BlockManager
from inference.core.sequence import Sequence, SequenceStatus

# A step that gives someone their first token carries at most this fraction (1/N) of its budget
# of other clients' long prompts: newcomers' first tokens come after a short step, not a full one.
FIRST_TOKEN_SHARE = 4


@dataclass(frozen=True)
class Chunk:
    """`seq.token_ids[start:start + num_tokens]` go through the model in this step.
    `is_last`: the chunk reaches the sequence's last token, so its logits give the next token.
    `is_scored`: logits for every row of the chunk (scoring a prompt), not only a last one.
    `num_draft_tokens`: the chunk ends with that many proposed tokens (a decode that verifies
    them): logits for its last token and each of them."""

    seq: Sequence
    start: int
    num_tokens: int
    is_last: bool
    kind: str  # "prefill" (the prompt, or a preempted sequence's recompute) or "decode"
    is_scored: bool = False
    num_draft_tokens: int = 0

    def logit_offsets(self) -> range:
        """The chunk's rows (from its first) whose logits the step computes."""
        if self.is_scored:
            return range(self.num_tokens)
        if not self.is_last:
            return range(0)
        return range(self.num_tokens - 1 - self.num_draft_tokens, self.num_tokens)

    @classmethod
    def next_of(cls, seq: Sequence, num_tokens: int) -> Chunk:
        start = seq.num_computed_tokens
        is_decode = num_tokens == 1 + seq.num_draft_tokens and start >= seq.num_prompt_tokens
        is_last = start + num_tokens == seq.num_tokens
        kind = "decode" if is_decode else "prefill"
        return cls(seq, start, num_tokens, is_last, kind, num_draft_tokens=seq.num_draft_tokens if is_last else 0)


@dataclass
class SchedulerOutput:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    imported: list[Sequence] = field(default_factory=list)  # admitted now: load their handed-over KV first

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    def has(self, seq: Sequence) -> bool:
        return any(c.seq is seq for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


MIN_PREFILL_TOKENS = 16  # a step's prefill room however small its token budget


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= 1")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.step_budget = max_num_batched_tokens  # this step's: at most the maximum (see schedule)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a sequence. One whose tokens could never fit the whole KV pool is refused."""
        if seq.num_blocks_needed(self.block_manager.block_size) > self.block_manager.num_blocks:
            raise ValueError(
                f"{seq.num_tokens} tokens need more KV blocks than the pool has "
                f"({self.block_manager.num_blocks} x {self.block_manager.block_size} tokens)"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_used_slots(self) -> int:
        return sum(seq.num_slots for seq in self.running)

    def schedule(self, token_budget: int | None = None) -> SchedulerOutput:
        """The next step's chunks, within `token_budget` tokens (None: `max_num_batched_tokens`;
        never below one token per decoding sequence plus MIN_PREFILL_TOKENS, so a small budget
        still lets every running answer take its token and a prompt move on)."""
        num_decoding = sum(1 for s in self.running if not s.is_prefilling)
        budget = self.max_num_batched_tokens if token_budget is None else token_budget
        self.step_budget = min(self.max_num_batched_tokens, max(budget, num_decoding + MIN_PREFILL_TOKENS))
        out = SchedulerOutput()
        # Decodes first (one token each: time between tokens stays short), then prefill chunks.
        for seq in [s for s in self.running if not s.is_prefilling]:
            self._schedule_running(seq, out, self._budget(out))
        self._fair_round(out)
        for seq in [s for s in self.running if s.is_prefilling]:  # what is left, oldest first
            self._schedule_running(seq, out, self._budget(out))
        while self.waiting and not out.preempted:
            members = self._admissible(self.waiting[0])
            if self._budget(out) <= 0 or not members:
                break
            for seq in members:
                self._admit(seq, out, self._budget(out))
        for seq in self.running:  # proposed tokens wait for no one: the next step proposes again
            if seq.num_draft_tokens and not out.has(seq):
                seq.drop_drafts()
        return out

    def stuck(self) -> list[Sequence]:
        """The head of the queue's group when it can never start: nothing runs, every block is
        free, and it still is not admitted (a preempted beam search whose beams each recompute
        their own copy of the prompt, more blocks than the pool; more places than `max_num_seqs`).
        Admission is in arrival order, so it would hold everyone behind it for ever: the caller
        ends it. [] otherwise."""
        bm = self.block_manager
        if self.running or not self.waiting or bm.num_free_blocks < bm.num_blocks:
            return []
        head = self.waiting[0]
        return [] if self._admissible(head) else _waiting_members(head)

    def _budget(self, out: SchedulerOutput) -> int:
        """Tokens left this step (a preempted chunk gives its share back)."""
        return self.step_budget - out.num_batched_tokens

    def _schedule_running(self, seq: Sequence, out: SchedulerOutput, limit: int) -> None:
        """The next chunk of a running sequence, of at most `limit` tokens (none once scheduled,
        preempted earlier in this step, or idle: waiting for its group)."""
        if limit <= 0 or seq.status != SequenceStatus.RUNNING or seq.is_idle or out.has(seq):
            return
        if seq.num_draft_tokens:  # proposed tokens take what is left of the budget and free blocks, no more
            room = min(limit, self._draft_room(out))
            seq.drop_drafts(seq.num_uncomputed_tokens - max(room, 1))
            if not self.block_manager.can_append(seq, seq.num_tokens):
                seq.drop_drafts()
        num_tokens = self._chunk_size(seq, limit)
        if self._make_room(seq, seq.num_computed_tokens + num_tokens, out):
            out.chunks.append(Chunk.next_of(seq, num_tokens))

    def _draft_room(self, out: SchedulerOutput) -> int:
        """Tokens of the step's budget left for a decode and its proposed tokens: those of the
        decodes not scheduled yet, and a prefill's least room while prompts wait, are kept."""
        num_unscheduled = sum(1 for s in self.running if not s.is_prefilling and not out.has(s))
        has_prompts = bool(self.waiting) or any(s.is_prefilling for s in self.running)
        return self._budget(out) - (num_unscheduled - 1) - (MIN_PREFILL_TOKENS if has_prompts else 0)

    def _fair_round(self, out: SchedulerOutput) -> None:
        """When several clients have prompts to prefill, each first gets a chunk of an equal share
        of the step's budget (its oldest running prefill, else its oldest waiting request), so one
        client's long prompts (or no-KV-cache recomputes) cannot hold everyone else's first token;
        what is left then goes in arrival order. First tokens first: when some clients' prompts end
        within their share and others' do not, the short ones go whole and the long ones share a
        `FIRST_TOKEN_SHARE`th of the budget, and the step takes nothing more, so a newcomer's first
        token rides on a short step rather than on a full one of someone's long prompt."""
        work: dict[str, Sequence] = {}
        for seq in [s for s in self.running if s.is_prefilling and not s.is_idle] + list(self.waiting):
            # A waiting request without a free slot takes no share: it cannot start now. (Only the
            # slot count here, every step: its blocks are checked once it is given its share.)
            if seq.client in work:
                continue
            if seq.status == SequenceStatus.RUNNING or self._fits_slots(_waiting_members(seq)):
                work[seq.client] = seq
        if len(work) < 2:
            return
        share = max(self._budget(out) // len(work), 1)
        long = [seq for seq in work.values() if seq.num_uncomputed_tokens > share]
        short = [seq for seq in work.values() if seq.num_uncomputed_tokens <= share]
        if short and long:
            self._give(short, out, share)
            self._give(long, out, max(self.step_budget // FIRST_TOKEN_SHARE // len(long), 1))
            self.step_budget = out.num_batched_tokens  # the step is full: nothing else joins it
        else:
            self._give(list(work.values()), out, share)

    def _give(self, seqs: list[Sequence], out: SchedulerOutput, share: int) -> None:
        """A chunk of at most `share` tokens (within the step's budget) to each of `seqs`,
        running or waiting, in order."""
        for seq in seqs:
            if out.preempted:
                return
            if seq.status == SequenceStatus.RUNNING:
                self._schedule_running(seq, out, min(share, self._budget(out)))
            elif (members := self._admissible(seq)) and self._budget(out) > 0:
                for member in members:
                    self._admit(member, out, min(share, self._budget(out)))

    def _chunk_size(self, seq: Sequence, budget: int) -> int:
        """Tokens of `seq` to compute now: as many as the budget allows, never cutting an image
        (a chunk may then run over the budget: the image's tokens need each other)."""
        start = seq.num_computed_tokens
        end = seq.chunk_end(start, start + min(seq.num_uncomputed_tokens, budget))
        return end - start

    def _fits_slots(self, members: list[Sequence]) -> bool:
        """Whether these waiting sequences fit in the free sequence slots now."""
        return self.num_used_slots + sum(m.num_slots for m in members) <= self.max_num_seqs

    def _admissible(self, head: Sequence) -> list[Sequence]:
        """The waiting sequences admitted with `head` (its group), if they fit now; else []."""
        members = _waiting_members(head)
        if not self._fits_slots(members):
            return []
        return members if self.block_manager.can_allocate_together(members) else []

    def _admit(self, seq: Sequence, out: SchedulerOutput, limit: int) -> None:
        self.waiting.remove(seq)
        self.block_manager.allocate(seq)
        if seq.num_imported_tokens:
            out.imported.append(seq)
        seq.status = SequenceStatus.RUNNING
        seq.first_scheduled_at = seq.first_scheduled_at or time.perf_counter()
        self.running.append(seq)
        out.chunks.append(Chunk.next_of(seq, self._chunk_size(seq, max(limit, 1))))

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Blocks for `seq`'s first `num_tokens` tokens, preempting the newest running sequences
        (with their group) as needed; False when `seq` itself had to go."""
        while not self.block_manager.can_append(seq, num_tokens):
            victims = [m for m in self.running[-1].members() if m.status == SequenceStatus.RUNNING]
            for victim in victims:
                # A handoff admitted in this step has not had its KV loaded yet: it keeps it to load
                # when it comes back (else the step loaded it into no blocks, and its first token,
                # which only the load emits, was lost).
                self._preempt(victim, is_loaded=victim not in out.imported)
            out.preempted += victims
            out.chunks = [c for c in out.chunks if c.seq not in victims]
            out.imported = [other for other in out.imported if other not in victims]
            if seq in victims:
                return False
        self.block_manager.append_slots(seq, num_tokens)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` (a copy of `parent`'s tokens) runs beside it, sharing its KV blocks; it takes
        one of the places `parent` held for its forks."""
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        child.first_scheduled_at = parent.first_scheduled_at
        parent.num_slots -= 1
        self.running.append(child)

    def recompute(self, seq: Sequence) -> None:
        """Drops the sequence's KV (no-KV-cache mode): its next step computes every token again."""
        self.block_manager.deallocate(seq)

    def _preempt(self, seq: Sequence, is_loaded: bool = True) -> None:
        seq.drop_drafts()
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        if is_loaded:
            seq.num_imported_tokens = 0  # its handed-over KV is gone with its blocks: recompute it
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, out: SchedulerOutput) -> None:
        """After the forward pass: the chunks' KV is in the cache now (proposed tokens' once
        verified: `accept_drafts`)."""
        for chunk in out.chunks:
            chunk.seq.num_computed_tokens = chunk.start + chunk.num_tokens - chunk.num_draft_tokens
            self.block_manager.mark_computed(chunk.seq)

    def accept_drafts(self, seq: Sequence, num_accepted: int) -> None:
        """After a verification: the proposed tokens are off the sequence and the tokens the model
        chose appended; the first `num_accepted` of those were proposed, so their KV is the pass's.
        The blocks the rejected ones took are given back (never hashed: the prefix cache holds
        only tokens that stayed)."""
        seq.num_computed_tokens += num_accepted
        assert seq.num_uncomputed_tokens >= 1, "the last token has no KV yet"
        self.block_manager.mark_computed(seq)
        self.block_manager.trim(seq)

    def finish(self, seq: Sequence) -> None:
        """The sequence ended (any reason, including cancel): free its blocks, forget it."""
        if seq.group is not None and seq in seq.group:
            seq.group.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED


def _waiting_members(head: Sequence) -> list[Sequence]:
    """`head`'s group (itself alone, or its beams / parallel choices) as far as it still waits."""
    return [m for m in head.members() if m.status == SequenceStatus.WAITING]
