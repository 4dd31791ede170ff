"""inference.core: the scheduler and block manager as plain bookkeeping, no device.

A tiny driver plays the model runner: each step it marks the scheduled chunks computed and
appends one token to every sequence whose chunk reached its last token."""

from __future__ import annotations

import pytest

from inference.core.block_manager import BlockManager
from inference.core.scheduler import FIRST_TOKEN_SHARE, Scheduler, SchedulerOutput
from inference.core.sequence import Sequence, SequenceStatus
from inference.sampling_params import SamplingParams

PARAMS = SamplingParams(greedy=True)


def seq(num_tokens: int, first: int = 0, **params) -> Sequence:
    return Sequence(list(range(first, first + num_tokens)), SamplingParams(greedy=True, **params))


def arrive(scheduler: Scheduler, client: str, num_tokens: int, first: int = 0, **params) -> Sequence:
    """A request of `client` added to the scheduler."""
    x = seq(num_tokens, first, **params)
    x.client = client
    scheduler.add(x)
    return x


def step(scheduler: Scheduler, next_token: int = 7) -> SchedulerOutput:
    out = scheduler.schedule()
    scheduler.update(out)
    for chunk in out.chunks:
        if chunk.is_last:
            chunk.seq.append_token(next_token)
    assert_counts_hold(scheduler.block_manager)
    return out


def assert_counts_hold(bm: BlockManager) -> None:
    """The block counts kept as blocks change hands equal a count over every block."""
    assert bm.stats()["num_shared_blocks"] == sum(1 for b in bm.blocks if b.ref_count > 1)
    assert bm.stats()["num_cached_free_blocks"] == sum(1 for i in bm.free if bm.blocks[i].hash is not None)


def test_prompt_is_chunked_under_the_token_budget_and_decodes_go_first() -> None:
    bm = BlockManager(num_blocks=64, block_size=4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=10)
    short, long = seq(3), seq(25, first=100)
    s.add(short)
    s.add(long)
    out = step(s)
    assert [(c.seq, c.start, c.num_tokens) for c in out.chunks] == [(short, 0, 3), (long, 0, 7)]
    out = step(s)  # short decodes (1 token) before long's next chunk (9 tokens)
    assert [(c.seq, c.kind, c.num_tokens) for c in out.chunks] == [(short, "decode", 1), (long, "prefill", 9)]
    assert not out.chunks[1].is_last
    out = step(s)
    assert [(c.seq, c.num_tokens, c.is_last) for c in out.chunks] == [(short, 1, True), (long, 9, True)]
    assert long.num_tokens == 26 and long.num_computed_tokens == 25


def test_sequence_limit_keeps_the_rest_waiting_in_arrival_order() -> None:
    s = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [seq(5, first=10 * i) for i in range(4)]
    for x in seqs:
        s.add(x)
    out = step(s)
    assert [c.seq for c in out.chunks] == seqs[:2]
    assert list(s.waiting) == seqs[2:]
    s.finish(seqs[0])
    out = step(s)
    assert [c.seq for c in out.chunks] == [seqs[1], seqs[2]]


def test_finishing_frees_blocks_and_a_later_request_shares_the_prefix() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    first = seq(10)
    s.add(first)
    step(s)
    assert bm.num_used_blocks == 3
    s.finish(first)
    assert_counts_hold(bm)
    assert bm.num_used_blocks == 0 and bm.stats()["num_cached_free_blocks"] == 2  # two full blocks hashed
    again = seq(10)
    s.add(again)
    out = step(s)
    assert again.num_cached_tokens == 8 and out.chunks[0].start == 8 and out.chunks[0].num_tokens == 2


def test_concurrent_requests_share_blocks_by_reference_count() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a = seq(9)
    s.add(a)
    step(s)
    b = seq(9)
    s.add(b)
    step(s)
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.stats()["num_shared_blocks"] == 2
    s.finish(a)
    assert all(bm.blocks[i].ref_count == 1 for i in b.block_table[:2])  # still held by b
    assert bm.stats()["num_shared_blocks"] == 0
    s.finish(b)
    assert_counts_hold(bm)
    assert bm.num_used_blocks == 0


def test_the_last_prompt_token_is_never_taken_from_the_cache() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    first = seq(8)
    s.add(first)
    step(s)
    s.finish(first)
    again = seq(8)  # both blocks are cached, but the last token's logits are needed
    s.add(again)
    out = step(s)
    assert again.num_cached_tokens == 4 and out.chunks[0].num_tokens == 4


def test_a_block_being_prefilled_is_not_shared_before_it_is_computed() -> None:
    bm = BlockManager(num_blocks=32, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=6)
    a = seq(20)
    s.add(a)
    step(s)  # a holds 5 blocks, but only tokens 0..5 are computed: block 0 alone is full and computed
    b = seq(20)
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[0] == a.block_table[0]


def test_no_prefix_cache_means_no_sharing() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a = seq(9, use_prefix_cache=False)
    s.add(a)
    step(s)
    s.finish(a)
    b = seq(9, use_prefix_cache=False)
    s.add(b)
    step(s)
    assert b.num_cached_tokens == 0


def test_out_of_blocks_preempts_the_newest_which_recomputes_later() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    old, new = seq(7, use_prefix_cache=False), seq(7, first=50, use_prefix_cache=False)
    s.add(old)
    s.add(new)
    step(s)
    step(s)
    assert bm.num_free_blocks == 0
    step(s)  # old: token 9 needs a third block: new is preempted
    assert new.status == SequenceStatus.WAITING and new.num_preemptions == 1 and new.num_computed_tokens == 0
    assert s.waiting[0] is new and s.num_preemptions == 1
    assert old.num_computed_tokens == 9
    s.finish(old)
    out = step(s)  # new comes back and recomputes prompt + its generated tokens
    assert [(c.seq, c.start, c.num_tokens, c.kind) for c in out.chunks] == [(new, 0, 9, "prefill")]


def test_a_sequence_that_can_never_fit_is_refused() -> None:
    s = Scheduler(BlockManager(num_blocks=2, block_size=4), max_num_seqs=4, max_num_batched_tokens=100)
    with pytest.raises(ValueError, match="more KV blocks than the pool has"):
        s.add(seq(9))


def test_cancel_of_a_waiting_sequence_frees_nothing_and_forgets_it() -> None:
    s = Scheduler(BlockManager(8, 4), max_num_seqs=1, max_num_batched_tokens=100)
    a, b = seq(3), seq(3)
    s.add(a)
    s.add(b)
    step(s)
    s.finish(b)
    assert b.is_finished and not s.waiting and s.running == [a]


def test_lru_evicts_the_least_recently_freed_prefix_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    x, y = seq(3, first=0), seq(3, first=10)
    for one in (x, y):
        s.add(one)
        step(s)
        s.finish(one)
    z = seq(5, first=20)  # needs 3 blocks: takes the 2 never-hashed ones and x's old block
    s.add(z)
    step(s)
    s.finish(z)
    w = seq(3, first=10)  # y's prefix survived
    s.add(w)
    step(s)
    assert w.num_cached_tokens == 2


@pytest.mark.parametrize("bad", [dict(max_num_seqs=0), dict(max_num_batched_tokens=0)])
def test_invalid_limits_name_the_value(bad: dict) -> None:
    args = {"max_num_seqs": 1, "max_num_batched_tokens": 1, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        Scheduler(BlockManager(4, 4), **args)


# ---- forks, groups, images: the bookkeeping behind beams, parallel sampling and vision ----------


def test_a_fork_shares_blocks_and_copies_the_partly_filled_one_on_write() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    parent = seq(6)
    s.add(parent)
    s.update(s.schedule())  # prefill 6 tokens, no token appended yet
    child = Sequence(list(parent.token_ids), parent.params)
    s.fork(parent, child)
    assert child.block_table == parent.block_table and bm.stats()["num_shared_blocks"] == 2
    parent.append_token(1)
    child.append_token(2)
    out = s.schedule()  # both decode into block 1 (positions 4-7): each needs its own copy
    assert {c.seq for c in out.chunks} == {parent, child}
    assert parent.block_table[0] == child.block_table[0]  # the full block stays shared
    assert parent.block_table[1] != child.block_table[1]
    copies = bm.take_copies()
    assert len(copies) == 1 and copies[0][0] in (parent.block_table[1], child.block_table[1])
    assert bm.take_copies() == []
    s.update(out)
    assert_counts_hold(bm)
    s.finish(parent)
    s.finish(child)
    assert bm.num_used_blocks == 0


def test_a_group_is_preempted_and_admitted_as_one() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    first = seq(8, first=100)
    s.add(first)
    step(s)
    group = [seq(4), seq(4, first=50)]
    for member in group:
        member.group = group
        s.add(member)
    step(s)
    assert all(m.status == SequenceStatus.RUNNING for m in group)
    for _ in range(3):  # first grows until the pool is full: the newest group goes, whole
        step(s)
    assert all(m.status == SequenceStatus.WAITING for m in group) and s.num_preemptions == 2
    s.finish(first)
    out = step(s)
    assert {c.seq for c in out.chunks} == set(group)  # admitted together


def test_an_idle_sequence_sits_out_and_a_chunk_never_cuts_an_image() -> None:
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=6)
    image = Sequence(list(range(20)), PARAMS, atomic_spans=((3, 12),))
    s.add(image)
    out = s.schedule()  # the budget (6) would cut the image: the chunk stops before it
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(0, 3)]
    s.update(out)
    out = s.schedule()  # the whole image, over the budget
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(3, 9)]
    s.update(out)
    out = s.schedule()
    s.update(out)
    out = s.schedule()
    s.update(out)
    assert image.is_idle and s.schedule().is_empty  # nothing to compute until a token is appended


def test_image_positions_key_the_prefix_cache_by_content() -> None:
    bm = BlockManager(num_blocks=32, block_size=2)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    red = Sequence([1, 2, 9, 9, 9, 9, 3, 4], PARAMS, key_overrides=((2, 6, -11),), atomic_spans=((2, 6),))
    s.add(red)
    s.update(s.schedule())
    s.finish(red)
    blue = Sequence([1, 2, 9, 9, 9, 9, 3, 4], PARAMS, key_overrides=((2, 6, -22),), atomic_spans=((2, 6),))
    red_again = Sequence([1, 2, 9, 9, 9, 9, 3, 4], PARAMS, key_overrides=((2, 6, -11),), atomic_spans=((2, 6),))
    s.add(blue)
    s.add(red_again)
    s.schedule()
    assert blue.num_cached_tokens == 2 and red_again.num_cached_tokens == 6


def test_the_core_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, inference.core.scheduler; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_clients_long_prompts_do_not_hold_another_clients_first_token() -> None:
    """Client a's two 2,000-token prompts fill every step's budget; client b's short prompt goes
    whole in the next step, which carries only a quarter of the budget of a's prompts, so b's
    first token rides on a short step; then a's prompts fill the steps again."""
    s = Scheduler(BlockManager(2048, 4), max_num_seqs=8, max_num_batched_tokens=256)
    for i in range(2):
        arrive(s, "a", 2000, first=i * 3000)
    step(s)
    short = arrive(s, "b", 30, first=9000)
    out = step(s)
    chunk = next(c for c in out.chunks if c.seq is short)
    assert chunk.num_tokens == 30 and chunk.is_last  # its whole prompt (under half the budget) at once
    assert out.num_batched_tokens == 30 + 256 // FIRST_TOKEN_SHARE  # a's prompts still move, a little
    out = step(s)
    assert out.num_batched_tokens == 256 and sum(c.kind == "decode" for c in out.chunks) == 1  # b decodes


def test_a_newcomer_without_a_free_slot_does_not_shorten_the_steps() -> None:
    s = Scheduler(BlockManager(2048, 4), max_num_seqs=1, max_num_batched_tokens=256)
    long = arrive(s, "a", 2000)
    step(s)
    short = arrive(s, "b", 30, first=9000)
    out = step(s)
    assert [c.seq for c in out.chunks] == [long] and out.num_batched_tokens == 256
    assert short.status == SequenceStatus.WAITING


def test_a_no_kv_cache_recompute_is_charged_to_its_client() -> None:
    """A request without a KV cache recomputes its whole context every step; with the fair share
    another client's prompt is still admitted at once beside it."""
    s = Scheduler(BlockManager(2048, 4), max_num_seqs=8, max_num_batched_tokens=128)
    arrive(s, "a", 600, use_kv_cache=False)
    for _ in range(5):
        step(s)
    light = arrive(s, "b", 20, first=7000)
    out = step(s)
    assert any(c.seq is light and c.is_last for c in out.chunks)


def test_a_step_budget_below_the_maximum_chunks_the_prompt_but_never_starves_the_decodes() -> None:
    """The pacer's budget (core.pacer): a smaller step, still room for every decode and a prompt."""
    from inference.core.scheduler import MIN_PREFILL_TOKENS

    s = Scheduler(BlockManager(256, 4), max_num_seqs=40, max_num_batched_tokens=512)
    decoding = [seq(2, first=1000 + 10 * i) for i in range(30)]
    for x in decoding:
        s.add(x)
    step(s)  # all prefilled: 30 sequences decode from now on
    long = seq(400, first=5000)
    s.add(long)
    out = s.schedule(token_budget=8)  # below the decodes: raised to them + MIN_PREFILL_TOKENS
    assert s.step_budget == 30 + MIN_PREFILL_TOKENS
    assert [c.seq for c in out.chunks if c.kind == "decode"] == decoding
    assert [(c.seq, c.num_tokens) for c in out.chunks if c.kind == "prefill"] == [(long, MIN_PREFILL_TOKENS)]
    s.update(out)
    for c in out.chunks:
        if c.is_last:
            c.seq.append_token(7)
    out = s.schedule(token_budget=100)
    assert s.step_budget == 100 and out.num_batched_tokens == 100  # 30 decodes + 70 of the prompt
    s.update(out)
    assert s.schedule(token_budget=10_000) and s.step_budget == 512  # never above the maximum


def test_the_pacer_keeps_prefill_steps_near_the_time_goal() -> None:
    from inference.core.pacer import StepPacer

    pacer = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    assert pacer.token_budget() == 512  # nothing measured yet
    pacer.observe(num_tokens=40, forward_ms=400)  # a small prefill is mostly fixed cost: not a token's
    assert pacer.token_budget() == 512
    pacer.observe(num_tokens=512, forward_ms=5120)  # 10 ms a token: a 0.5B model on 2 cores
    assert pacer.token_budget() == 50
    pacer.observe(num_tokens=64, forward_ms=1280)  # the context grew: 20 ms a token now
    assert pacer.token_budget() == 25  # the latest cost, not the lagging average (13 ms)
    pacer.observe(num_tokens=100, forward_ms=500)  # a cheaper step: the average (10.6 ms) decides
    assert pacer.token_budget() == int(500 / (0.7 * (0.7 * 10 + 0.3 * 20) + 0.3 * 5))


def test_the_pacer_prices_a_prefilled_token_beyond_a_steps_fixed_cost() -> None:
    """A step without prefill is the fixed part: on matrix units 8 decode rows cost about one, so a
    prompt priced per token with that cost in it would split eight chat prompts over two steps."""
    from inference.core.pacer import StepPacer

    pacer = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    pacer.observe(num_tokens=8, forward_ms=100, is_prefill=False)  # 8 decode rows
    assert pacer.fixed_ms == 100 and pacer.token_budget() == 512  # no prefill measured yet
    pacer.observe(num_tokens=72, forward_ms=460)  # 8 decodes + a 64-token prompt: 5 ms a token beyond them
    assert pacer.ms_per_token == 5
    assert pacer.token_budget() == 80  # (500 - 100) / 5: not 500 / (460 / 72) = 78
    pacer.observe(num_tokens=8, forward_ms=200, is_prefill=False)  # the decodes got dearer: less room
    assert pacer.fixed_ms == 130 and pacer.token_budget() == 74
    cheap = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    cheap.observe(num_tokens=1, forward_ms=25, is_prefill=False)
    cheap.observe(num_tokens=300, forward_ms=145)  # priced per token with its fixed part, 280 would not fit
    assert cheap.token_budget() == 512
    slow = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    slow.observe(num_tokens=16, forward_ms=600, is_prefill=False)  # decodes alone overrun the goal
    slow.observe(num_tokens=80, forward_ms=1000)
    assert slow.token_budget() == 1  # the scheduler's floor then decides (MIN_PREFILL_TOKENS)


def test_a_step_its_budget_did_not_bound_only_joins_the_average() -> None:
    """Eight chat prompts arriving together: the first often prefills alone and slow (what runs
    beside the engine); priced at that cost, the next burst would be split over two steps."""
    from inference.core.pacer import StepPacer

    pacer = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    pacer.observe(num_tokens=8, forward_ms=25, is_prefill=False)
    pacer.observe(num_tokens=512, forward_ms=25 + 512 * 0.5)  # a full budget: 0.5 ms a token
    assert pacer.token_budget() == 512
    pacer.observe(num_tokens=300, forward_ms=25 + 300 * 1.5)  # a burst, not bound: 1.5 ms a token
    assert pacer.ms_per_token == pytest.approx(0.7 * 0.5 + 0.3 * 1.5)  # not 1.5, which gives 316
    assert pacer.token_budget() == 512


def test_the_pacer_without_a_goal_or_with_a_fast_model_keeps_the_whole_budget() -> None:
    from inference.core.pacer import StepPacer

    fast = StepPacer(max_step_ms=500, max_num_batched_tokens=512)
    fast.observe(num_tokens=512, forward_ms=50)
    assert fast.token_budget() == 512  # a fast model keeps the whole budget
    untimed = StepPacer(max_step_ms=None, max_num_batched_tokens=512)
    untimed.observe(num_tokens=512, forward_ms=1e6)
    assert untimed.token_budget() == 512
    with pytest.raises(ValueError, match="max_step_ms=0"):
        StepPacer(max_step_ms=0, max_num_batched_tokens=512)


def test_a_preempted_group_shares_its_cached_prompt_when_it_comes_back() -> None:
    """Three beams of a 16-token prompt need 3 x 5 blocks when each recomputes its own copy: more
    than the pool of 10, so they never came back and held everyone behind them. Their prompt's
    blocks are cached: counted once, the group fits (4 shared + 3 x 1 of their own = 7)."""
    s = Scheduler(BlockManager(num_blocks=10, block_size=4), max_num_seqs=8, max_num_batched_tokens=64)
    primer = seq(17)
    s.add(primer)
    step(s)  # 17 tokens computed: 4 full blocks hashed
    s.finish(primer)
    group = [Sequence([*range(16), 100 + i], PARAMS) for i in range(3)]
    for member in group:
        member.group = group
        s.add(member)
    assert not s.stuck()
    out = step(s)
    assert {c.seq for c in out.chunks} == set(group)
    assert all(m.num_cached_tokens == 16 for m in group)


def test_a_group_that_can_never_start_is_named_stuck_not_left_waiting() -> None:
    """Without the prefix cache the same group needs 15 blocks of 10: with nothing running and the
    pool empty it can never start, so the engine ends it (`stuck`) instead of waiting for ever."""
    s = Scheduler(BlockManager(num_blocks=10, block_size=4), max_num_seqs=8, max_num_batched_tokens=64)
    group = [seq(17, use_prefix_cache=False) for _ in range(3)]
    for member in group:
        member.group = group
        s.add(member)
    behind = arrive(s, "", 4, first=60)
    assert s.schedule().is_empty  # the head does not fit, and admission is in arrival order
    assert s.stuck() == group
    for member in list(group):  # (finishing a member takes it out of its group)
        s.finish(member)
    assert not s.stuck() and [c.seq for c in step(s).chunks] == [behind]


def test_a_handoff_preempted_in_the_step_that_admitted_it_keeps_its_kv_to_load() -> None:
    """A handed-over sequence admitted in a step's fair round, then preempted in the same step for
    another client's no-KV recompute: its KV was never loaded, so it must still be loaded when it
    comes back (it was dropped, and the step tried to load it into no blocks)."""
    s = Scheduler(BlockManager(num_blocks=8, block_size=4), max_num_seqs=8, max_num_batched_tokens=64)
    recomputing = [arrive(s, "x", 8, first=10 * i, use_kv_cache=False) for i in range(2)]
    step(s)
    for x in recomputing:
        s.recompute(x)  # no KV cache: every step computes all of its tokens again
    handed = Sequence(list(range(100, 112)), PARAMS, num_prompt_tokens=11)
    handed.num_imported_tokens, handed.client = 11, "y"
    s.add(handed)
    out = s.schedule()
    assert handed in out.preempted and handed not in out.imported  # nothing to load into
    assert handed.status == SequenceStatus.WAITING and handed.num_imported_tokens == 11


def test_a_block_behind_a_duplicate_is_keyed_by_its_whole_prefix() -> None:
    """Two requests with one prompt prefill at once: the second's blocks duplicate the first's, so
    they stay unhashed. Its next chunk's block was then hashed with no parent, as if it began a
    prompt: a later prompt starting with those 4 tokens reused KV computed at positions 4-7 behind
    other tokens (the explorer's "·is" at 98% after "The capital of France is")."""
    s = Scheduler(BlockManager(num_blocks=20, block_size=4), max_num_seqs=8, max_num_batched_tokens=16)
    first, second = seq(12), seq(12)
    s.add(first)
    s.add(second)
    step(s)  # the first's 12 tokens, the second's first 4 (a duplicate of the first's block 0)
    step(s)  # the second's next 8: its block 1 ([4, 5, 6, 7]) computed behind block 0
    later = Sequence([4, 5, 6, 7, 99, 98], PARAMS)
    assert s.block_manager._prefix_hits(later) == []
    again = seq(13)
    assert len(s.block_manager._prefix_hits(again)) == 3  # the same prefix still hits, whole
