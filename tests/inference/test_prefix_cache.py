"""The prefix cache inside the engine: KV blocks shared by hash give the same tokens and
logits as recomputing (one-token blocks here, so every count is exact), within the pool.
The block bookkeeping itself is tested in core/test_scheduler.py."""

from __future__ import annotations

import pytest
import torch

from inference import EngineConfig, Prefilled, Step
from inference.engine import Engine
from tests.inference.engines import engine_for, run

# ---- inside the engine: reuse gives the same tokens and logits as recomputing --------------

SAMPLINGS = {"greedy": dict(greedy=True), "seeded": dict(temperature=0.9, seed=1234)}
NUM_ALTERNATIVES = 20
TINY_PROMPT = [5, 77, 130, 9, 200, 41, 17, 99]


def common_length(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def generate(engine: Engine, prompt_ids: list[int], **params) -> tuple[Prefilled, list[Step]]:
    events, steps, _ = run(engine, prompt_ids, num_alternatives=NUM_ALTERNATIVES, **params)
    return events[0], steps


def assert_same_as_uncached(engine: Engine, prompt_ids: list[int], expected_cached: int, **params) -> list[Step]:
    """Generate with the prefix cache (expecting `expected_cached` reused tokens), then without
    it: same tokens, and first-step raw logprobs equal up to float rounding."""
    prefilled, cached = generate(engine, prompt_ids, **params)
    assert prefilled.num_cached_tokens == expected_cached
    assert prefilled.num_prefilled_tokens == len(prompt_ids) - expected_cached
    reference_prefilled, uncached = generate(engine, prompt_ids, use_prefix_cache=False, **params)
    assert reference_prefilled.num_cached_tokens == 0
    assert [s.token_id for s in cached] == [s.token_id for s in uncached]
    got, expected = cached[0].top_raw, uncached[0].top_raw
    assert [a.token_id for a in got] == [a.token_id for a in expected]
    torch.testing.assert_close(
        torch.tensor([a.logprob for a in got]), torch.tensor([a.logprob for a in expected]), atol=1e-4, rtol=1e-4
    )
    return cached


def tiny_engine(arch: str) -> Engine:
    return engine_for(arch, block_size=1)


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("arch", ["deepseek_v3", "llama", "gpt2"])
def test_tiny_second_turn_regenerate_edit_and_branch(arch, sampling):
    params = dict(max_new_tokens=6, ignore_eos=True, **SAMPLINGS[sampling])
    engine = tiny_engine(arch)
    first_prefilled, turn1 = generate(engine, TINY_PROMPT, **params)
    assert first_prefilled.num_cached_tokens == 0
    answer = [s.token_id for s in turn1]
    # next turn: everything computed last time (prompt + answer but its last token) is reused
    turn2 = TINY_PROMPT + answer + [10, 85, 115, 10]
    assert_same_as_uncached(engine, turn2, len(TINY_PROMPT) + len(answer) - 1, **params)
    # regenerate: the same prompt again reuses all but its last token (whose logits are needed)
    assert_same_as_uncached(engine, turn2, len(turn2) - 1, **params)
    # an edited earlier message: reuse stops at the edit
    edited = TINY_PROMPT[:3] + [66] + TINY_PROMPT[4:] + [10, 85]
    assert_same_as_uncached(engine, edited, 3, **params)
    # an explorer branch: prompt + 2 generated tokens + a token the model did not pick
    branch = TINY_PROMPT + answer[:2] + [(answer[2] + 1) % 256]
    assert_same_as_uncached(engine, branch, len(TINY_PROMPT) + 2, **params)
    assert engine.prefix_cache_stats()["hits"] == 4


@pytest.fixture(scope="module")
def bundled_engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig(block_size=1))


def chat_ids(engine: Engine, messages: list[dict]) -> list[int]:
    return engine.prompts.encode(engine.prompts.render_chat(messages).text)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_bundled_chat_turns_reuse_the_prefix(bundled_engine, sampling):
    engine = bundled_engine
    engine.core.block_manager.reset_prefix_cache()
    params = dict(max_new_tokens=8, **SAMPLINGS[sampling])
    question = {"role": "user", "content": "Name three colours."}
    turn1_ids = chat_ids(engine, [question])
    _, turn1 = generate(engine, turn1_ids, **params)
    answer_ids = [s.token_id for s in turn1]
    answer_text = engine.loaded.tokenizer.decode(answer_ids, skip_special_tokens=True)

    turn2_ids = chat_ids(
        engine,
        [question, {"role": "assistant", "content": answer_text}, {"role": "user", "content": "And three animals?"}],
    )
    # The re-rendered history matches what was computed up to where the template closes the
    # answer differently (or the answer re-tokenizes differently): reuse exactly that much.
    expected = common_length(turn2_ids, turn1_ids + answer_ids[:-1])
    assert expected > len(turn1_ids)
    assert_same_as_uncached(engine, turn2_ids, expected, **params)
    assert_same_as_uncached(engine, turn2_ids, len(turn2_ids) - 1, **params)  # regenerate

    edited_ids = chat_ids(engine, [{"role": "user", "content": "Name three fruits."}])
    assert_same_as_uncached(engine, edited_ids, common_length(edited_ids, turn1_ids), **params)

    branch_ids = turn1_ids + answer_ids[:3] + [engine.prompts.encode(" zebra")[0]]
    assert_same_as_uncached(engine, branch_ids, len(turn1_ids) + 3, **params)
    stats = engine.prefix_cache_stats()
    assert stats["hits"] == 4 and stats["num_bytes"] <= stats["max_bytes"]
    assert stats["num_cached_tokens"] > len(turn2_ids)


def test_bundled_cache_lives_in_the_pool_and_evicts_the_oldest(bundled):
    """The cache is the pool's free blocks: a prompt of 80 tokens in a 100-token pool, then
    another: the second evicts the first's oldest blocks (least recently freed first)."""
    engine = Engine(bundled, EngineConfig(block_size=1, kv_cache_bytes=100 * 46080))  # 100 float32 tokens
    assert engine.info.kv_bytes_per_token == 46080
    first = chat_ids(engine, [{"role": "user", "content": "The sea was calm and grey. " * 7}])
    second = chat_ids(engine, [{"role": "user", "content": "A cat sat by the warm fire. " * 7}])
    assert 60 < len(first) < 90 and 60 < len(second) < 90
    generate(engine, first, greedy=True, max_new_tokens=4)
    stats = engine.prefix_cache_stats()
    assert stats["num_stored_tokens"] == len(first) + 3 and stats["max_bytes"] == 100 * 46080
    generate(engine, second, greedy=True, max_new_tokens=4)
    assert engine.prefix_cache_stats()["num_bytes"] <= engine.prefix_cache_stats()["max_bytes"]
    prefilled, _ = generate(engine, first, greedy=True, max_new_tokens=1)
    shared = common_length(first, second)  # the template's opening tokens: they stayed in use
    assert shared <= prefilled.num_cached_tokens < len(first) - 1  # its tail was evicted
