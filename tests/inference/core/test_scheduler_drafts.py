"""inference.core with proposed tokens (speculative decoding) on a sequence: the scheduler trims them
to the budget and the free blocks, drops them when it does not schedule them, never counts them as
computed until verified, and gives their blocks back when they are rejected."""

from __future__ import annotations

from inference.core.block_manager import BlockManager
from inference.core.scheduler import MIN_PREFILL_TOKENS, Scheduler
from inference.core.sequence import Sequence
from inference.sampling_params import SamplingParams


def decoding(scheduler: Scheduler, num_sequences: int = 1, num_prompt: int = 6) -> list[Sequence]:
    """Running sequences whose prompts are computed and whose first tokens wait for their decode."""
    seqs = [
        Sequence(list(range(50 * i, 50 * i + num_prompt)), SamplingParams(greedy=True)) for i in range(num_sequences)
    ]
    for seq in seqs:
        scheduler.add(seq)
    scheduler.update(scheduler.schedule())
    for seq in seqs:
        seq.append_token(99)
    return seqs


def test_a_decode_verifies_its_proposed_tokens_in_one_chunk_with_a_logits_row_each() -> None:
    s = Scheduler(BlockManager(num_blocks=16, block_size=4), max_num_seqs=4, max_num_batched_tokens=64)
    (seq,) = decoding(s)
    seq.add_drafts([1, 2, 3])
    assert not seq.is_prefilling and seq.num_tokens == 10
    out = s.schedule()
    (chunk,) = out.chunks
    assert (chunk.start, chunk.num_tokens, chunk.kind, chunk.num_draft_tokens) == (6, 4, "decode", 3)
    assert list(chunk.logit_offsets()) == [0, 1, 2, 3]
    s.update(out)
    assert seq.num_computed_tokens == 7  # the proposed tokens' KV counts once they are verified
    assert seq.drop_drafts() == [1, 2, 3]
    seq.append_token(1)  # the model agreed with the first, then chose 5
    seq.append_token(5)
    s.accept_drafts(seq, 1)
    assert (seq.num_computed_tokens, seq.num_uncomputed_tokens, len(seq.block_table)) == (8, 1, 3)


def test_proposed_tokens_are_trimmed_to_the_budget_left_and_to_the_free_blocks() -> None:
    s = Scheduler(BlockManager(num_blocks=16, block_size=4), max_num_seqs=4, max_num_batched_tokens=24)
    a, b = decoding(s, 2)
    waiting = Sequence(list(range(100, 140)), SamplingParams(greedy=True))
    s.add(waiting)
    a.add_drafts(list(range(10)))
    out = s.schedule()
    # b's decode and a prompt's least room are kept: a's chunk is 24 - 1 - 16 = 7 tokens, 6 of its 10 proposed
    first = out.chunks[0]
    assert first.seq is a and first.num_tokens == 24 - 1 - MIN_PREFILL_TOKENS and a.num_draft_tokens == 6
    assert any(c.seq is b and c.num_tokens == 1 for c in out.chunks)
    tight = Scheduler(BlockManager(num_blocks=2, block_size=4), max_num_seqs=4, max_num_batched_tokens=64)
    (c,) = decoding(tight)
    c.add_drafts([1, 2, 3, 4, 5])  # 12 tokens need 3 blocks; 2 exist: none is verified
    (chunk,) = tight.schedule().chunks
    assert (chunk.num_tokens, chunk.num_draft_tokens, c.num_draft_tokens) == (1, 0, 0)


def test_unscheduled_or_preempted_sequences_lose_their_proposed_tokens() -> None:
    s = Scheduler(BlockManager(num_blocks=4, block_size=4), max_num_seqs=4, max_num_batched_tokens=64)
    old, new = decoding(s, 2)
    new.add_drafts([1, 2, 3, 4, 5, 6])
    old.add_drafts([7])
    s.schedule()  # old's 2 tokens fit; new's would need blocks held by old: trimmed, not preempting old
    assert old.num_draft_tokens == 1 and old.token_ids[-1] == 7
    assert new.num_draft_tokens == 0 and new.token_ids[-1] == 99
    s._preempt(old)
    assert old.num_draft_tokens == 0 and old.token_ids[-1] == 99
