"""Continuous batching: requests that share steps get exactly what they would get alone.

Greedy tokens of every request in a mixed batch (different lengths, arriving at different
steps, prefill chunks beside decodes) equal its tokens alone through `Engine.generate`, on
the bundled model and tiny random Llama-family models; logits agree closely; a seeded
request draws the same tokens whoever shares its step; cancel ends one request only."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inference import EngineConfig, Finished, Prefilled, SamplingParams, Step
from inference.engine import Engine
from inference.kv.paged import PagedKVPool
from tests.inference.engines import engine_for


def run_all(
    engine: Engine,
    requests: list[tuple[list[int], SamplingParams]],
    arrive_every: int = 0,
    cancel_after: dict[int, int] | None = None,
) -> dict[int, list]:
    """Adds the requests (one every `arrive_every` steps; 0: all at once) and steps until done."""
    events: dict[int, list] = {}
    ids: list[int] = []
    pending = list(requests)
    num_steps = 0
    while pending or engine.has_unfinished:
        if pending and (arrive_every == 0 or num_steps % arrive_every == 0):
            for prompt_ids, params in pending if arrive_every == 0 else pending[:1]:
                ids.append(engine.add_request(prompt_ids, params))
                events[ids[-1]] = []
            pending = [] if arrive_every == 0 else pending[1:]
        for request_id, event in engine.step():
            events[request_id].append(event)
        for index, after in (cancel_after or {}).items():
            if index < len(ids) and len([e for e in events[ids[index]] if isinstance(e, Step)]) == after:
                engine.cancel(ids[index])
        num_steps += 1
        assert num_steps < 10_000
    return {i: events[request_id] for i, request_id in enumerate(ids)}


def run_to_ends(
    engine: Engine, requests: list[tuple[list[int], SamplingParams]], arrive_every: int = 0
) -> list[tuple[list[Step], Finished]]:
    """`run_all`, each request's steps and its `Finished` record."""
    events = run_all(engine, requests, arrive_every)
    return [([e for e in events[i] if isinstance(e, Step)], events[i][-1]) for i in range(len(requests))]


def tokens(events: list) -> list[int]:
    return [e.token_id for e in events if isinstance(e, Step)]


def alone(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> list:
    return list(engine.generate(prompt_ids, params))


@pytest.fixture(scope="module")
def bundled_engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig(max_num_batched_tokens=64, block_size=16))


PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived a woodcutter who " * 3,
]


def test_greedy_in_a_mixed_batch_equals_alone_on_the_bundled_model(bundled_engine: Engine) -> None:
    engine = bundled_engine
    params = SamplingParams(greedy=True, max_new_tokens=24, ignore_eos=True, num_alternatives=5, use_prefix_cache=False)
    requests = [(engine.prompts.encode(p), params) for p in PROMPTS]
    batched = run_all(engine, requests, arrive_every=3)  # the long prompt is chunked beside decodes
    for i, (prompt_ids, _) in enumerate(requests):
        expected = alone(engine, prompt_ids, params)
        assert tokens(batched[i]) == tokens(expected), f"request {i}"
        got_steps = [e for e in batched[i] if isinstance(e, Step)]
        want_steps = [e for e in expected if isinstance(e, Step)]
        assert max(abs(a.raw_logprob - b.raw_logprob) for a, b in zip(got_steps, want_steps)) < 1e-3
        assert [a.piece for a in got_steps] == [b.piece for b in want_steps]
        assert isinstance(batched[i][0], Prefilled) and isinstance(batched[i][-1], Finished)
        assert batched[i][-1].text == expected[-1].text


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_in_a_batch_equals_alone_on_tiny_models(arch: str) -> None:
    engine = engine_for(arch)
    params = SamplingParams(greedy=True, max_new_tokens=12, ignore_eos=True, use_prefix_cache=False)
    requests = [([3 + (i * 7 + j) % 200 for j in range(5 + 9 * i)], params) for i in range(5)]
    batched = run_all(engine, requests)
    for i, (prompt_ids, _) in enumerate(requests):
        assert tokens(batched[i]) == tokens(alone(engine, prompt_ids, params))


def test_a_seeded_request_draws_the_same_tokens_whoever_shares_its_step(bundled_engine: Engine) -> None:
    engine = bundled_engine
    seeded = (
        engine.prompts.encode(PROMPTS[0]),
        SamplingParams(
            temperature=0.9, top_p=0.95, seed=11, max_new_tokens=16, ignore_eos=True, use_prefix_cache=False
        ),
    )
    others = [
        (engine.prompts.encode(p), SamplingParams(temperature=1.2, max_new_tokens=10, use_prefix_cache=False))
        for p in PROMPTS[1:3]
    ]
    with_others = run_all(engine, [seeded, *others])[0]
    by_itself = run_all(engine, [seeded])[0]
    assert tokens(with_others) == tokens(by_itself) == tokens(alone(engine, *seeded))


def test_cancel_ends_one_request_and_the_others_continue_unharmed(bundled_engine: Engine) -> None:
    engine = bundled_engine
    params = SamplingParams(greedy=True, max_new_tokens=12, ignore_eos=True, use_prefix_cache=False)
    requests = [(engine.prompts.encode(p), params) for p in PROMPTS[:3]]
    events = run_all(engine, requests, cancel_after={1: 4})
    cancelled = events[1]
    assert cancelled[-1].finish_reason == "cancelled" and len(tokens(cancelled)) == 4
    assert [e for e in cancelled if isinstance(e, Finished)] == [cancelled[-1]]
    for i in (0, 2):
        assert tokens(events[i]) == tokens(alone(engine, *requests[i]))
    assert not engine.has_unfinished and engine.core.block_manager.num_used_blocks == 0


def test_the_prefix_cache_is_shared_blocks_and_reports_cached_tokens(bundled_engine: Engine) -> None:
    engine = bundled_engine
    params = SamplingParams(greedy=True, max_new_tokens=6, ignore_eos=True)
    first_prompt = engine.prompts.encode(PROMPTS[3])
    first = run_all(engine, [(first_prompt, params)])[0]
    answer = [e.token_id for e in first if isinstance(e, Step)]
    turn_two = first_prompt + answer + engine.prompts.encode(" And then?")
    second = run_all(engine, [(turn_two, params)])[0]
    prefilled = second[0]
    block = engine.core.block_manager.block_size
    assert prefilled.num_cached_tokens == (len(first_prompt) + len(answer) - 1) // block * block > 0
    assert prefilled.num_prefilled_tokens == len(turn_two) - prefilled.num_cached_tokens
    assert tokens(second) == tokens(alone(engine, turn_two, replace(params, use_prefix_cache=False)))


def test_preemption_recomputes_and_still_gives_the_same_tokens(bundled) -> None:
    engine = Engine(bundled, EngineConfig(block_size=16, kv_cache_bytes=6 * 16 * 46_080))  # 6 blocks of 16 tokens
    params = SamplingParams(greedy=True, max_new_tokens=30, ignore_eos=True, use_prefix_cache=False)
    requests = [(engine.prompts.encode(p), params) for p in PROMPTS[:3]]
    events = run_all(engine, requests)
    assert engine.core.scheduler.num_preemptions > 0
    for i, (prompt_ids, _) in enumerate(requests):
        assert tokens(events[i]) == tokens(alone(engine, prompt_ids, params))


def test_beam_search_and_no_kv_cache_requests_run_in_the_batch(bundled_engine: Engine) -> None:
    engine = bundled_engine
    ids = engine.prompts.encode(PROMPTS[0])
    greedy = SamplingParams(greedy=True, max_new_tokens=6, ignore_eos=True, use_prefix_cache=False)
    no_cache = replace(greedy, use_kv_cache=False)
    beams = SamplingParams(greedy=True, num_beams=2, max_new_tokens=4, use_prefix_cache=False)
    events = run_all(engine, [(ids, greedy), (ids, no_cache), (ids, beams)])
    assert tokens(events[0]) == tokens(events[1]) == tokens(alone(engine, ids, greedy))
    got, expected = events[2][-1].sequences, alone(engine, ids, beams)[-1].sequences
    assert [b.token_ids for b in got] == [b.token_ids for b in expected]
    assert [b.score for b in got] == pytest.approx([b.score for b in expected], abs=1e-5)


def test_a_prompt_larger_than_the_kv_pool_is_a_clear_error(bundled) -> None:
    engine = Engine(bundled, EngineConfig(block_size=16, kv_cache_bytes=2 * 16 * 46_080))
    with pytest.raises(ValueError, match="more KV blocks than the pool has"):
        engine.add_request(engine.prompts.encode(PROMPTS[3]), SamplingParams(greedy=True))
    assert not engine.has_unfinished


def test_a_handoff_joins_the_batch_with_its_kv_loaded_into_blocks(bundled_engine: Engine) -> None:
    """The decode side of PD: the prefill worker's KV goes into this worker's blocks and the
    request decodes inside the batch, with the same tokens as colocated (greedy and seeded)."""
    engine = bundled_engine
    for params in (
        SamplingParams(greedy=True, max_new_tokens=10, ignore_eos=True, use_prefix_cache=False),
        SamplingParams(temperature=0.8, seed=5, max_new_tokens=10, ignore_eos=True, use_prefix_cache=False),
    ):
        ids = engine.prompts.encode(PROMPTS[1])
        handoff = engine.import_handoff(engine.export_handoff(engine.prefill_for_handoff(ids, params)))
        neighbour = engine.add_request(engine.prompts.encode(PROMPTS[0]), params)
        request_id = engine.add_request(ids, params, handoff=handoff)
        events: dict[int, list] = {neighbour: [], request_id: []}
        shared_a_step = False
        while engine.has_unfinished:
            stepped = engine.step()
            for rid, event in stepped:
                events[rid].append(event)
            step = engine.last_batch_step
            shared_a_step |= bool(step) and {c["request_id"] for c in step.chunks} == {neighbour, request_id}
        assert shared_a_step, "the handed-over request never decoded in the same step as its neighbour"
        assert isinstance(events[request_id][0], Prefilled)
        assert tokens(events[request_id]) == tokens(alone(engine, ids, params))
        assert events[request_id][-1].finish_reason == "length"
    assert engine.core.block_manager.num_used_blocks == 0


def test_batched_requests_report_the_kv_bytes_they_hold(bundled_engine: Engine) -> None:
    engine = bundled_engine
    params = SamplingParams(greedy=True, max_new_tokens=4, ignore_eos=True, use_prefix_cache=False)
    events = run_all(engine, [(engine.prompts.encode(PROMPTS[0]), params)])[0]
    per_token = engine.runner.pool.bytes_per_token
    prefilled, steps = events[0], [e for e in events if isinstance(e, Step)]
    assert prefilled.kv_cache_bytes == prefilled.num_prompt_tokens * per_token
    assert [s.kv_cache_bytes for s in steps] == [(prefilled.num_prompt_tokens + i) * per_token for i in range(4)]


def test_prefill_only_exports_the_kv_from_blocks_and_a_decode_in_the_batch_continues_it(
    bundled_engine: Engine,
) -> None:
    """Both sides of PD through the batch: a prefill-only request ends with its handoff (KV
    exported from its blocks), which another request imports and decodes to the colocated tokens."""
    from inference.kv.transfer import HandedOff

    engine = bundled_engine
    params = SamplingParams(temperature=0.7, seed=3, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)
    ids = engine.prompts.encode(PROMPTS[2])
    request_id = engine.add_request(ids, params, prefill_only=True)
    events = []
    while engine.has_unfinished:
        events += [event for rid, event in engine.step() if rid == request_id]
    assert [type(e) for e in events] == [Prefilled, Step, HandedOff]
    handoff = engine.import_handoff(engine.export_handoff(events[-1].handoff))
    assert handoff.layers[0][0].shape[1] == len(ids)
    decode_id = engine.add_request(ids, params, handoff=handoff)
    decoded = []
    while engine.has_unfinished:
        decoded += [event for rid, event in engine.step() if rid == decode_id]
    assert tokens(decoded) == tokens(alone(engine, ids, params))


def test_a_run_without_a_seed_reports_the_one_it_drew_and_replays_with_it(bundled_engine: Engine) -> None:
    engine = bundled_engine
    unseeded = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)
    ids = engine.prompts.encode(PROMPTS[0])
    events = run_all(engine, [(ids, unseeded)])[0]
    seed = events[-1].seed
    assert isinstance(seed, int)
    again = alone(engine, ids, replace(unseeded, seed=seed))
    assert tokens(again) == tokens(events) and again[-1].seed == seed


def test_a_request_whose_row_cannot_be_sampled_ends_alone_and_the_batch_goes_on(bundled_engine: Engine) -> None:
    """One request's logits turn NaN mid-answer (what a broken setting or a bad kernel gives): it
    ends with an error of its own; the three others sharing its steps finish as they would alone."""
    engine = bundled_engine
    params = SamplingParams(greedy=True, max_new_tokens=10, ignore_eos=True, use_prefix_cache=False)
    requests = [(engine.prompts.encode(p), params) for p in PROMPTS]
    ids = [engine.add_request(prompt_ids, params) for prompt_ids, params in requests]
    real_run = engine.runner.run

    def run(chunks, pixel_values=None):
        out = real_run(chunks, pixel_values)
        logits = out.logits.clone()
        for row, chunk in enumerate(c for c in chunks if c.is_last):
            if engine.core.owners[chunk.seq.seq_id].request_id == ids[1] and chunk.seq.num_generated_tokens >= 3:
                logits[row] = float("nan")
        return replace(out, logits=logits)

    engine.runner.run = run
    events: dict[int, list] = {i: [] for i in ids}
    try:
        while engine.has_unfinished:
            for request_id, event in engine.step():
                events[request_id].append(event)
    finally:
        engine.runner.run = real_run
    events = [events[i] for i in ids]
    assert events[1][-1].finish_reason == "error" and "no token to choose from" in events[1][-1].error
    assert len(tokens(events[1])) == 3
    for i in (0, 2, 3):
        assert events[i][-1].finish_reason == "length"
        assert tokens(events[i]) == tokens(alone(engine, *requests[i]))


@pytest.mark.parametrize(("start", "end"), [(0, 0), (0, 1), (0, 16), (3, 16), (15, 17), (5, 40), (16, 48), (33, 34)])
def test_a_sequences_slots_follow_its_block_table(start: int, end: int) -> None:
    pool = PagedKVPool(1, 8, 16, 1, 4, torch.float32, torch.device("cpu"))
    table = [5, 2, 7]
    want = [table[p // 16] * 16 + p % 16 for p in range(start, end)]
    assert pool.slot_ids(table, start, end) == want
    assert pool.slots(table, start, end).tolist() == want
