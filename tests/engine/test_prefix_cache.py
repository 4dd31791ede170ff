"""The prefix cache: radix-tree bookkeeping on fake tensors, then KV reuse inside the engine."""

from __future__ import annotations

import pytest
import torch

from inference import EngineConfig, Prefilled, Step
from inference.engine import Engine
from inference.kv.cache import layer_kv_nbytes
from inference.kv.prefix_cache import PrefixCache
from tests.engine.engines import engine_for, run

NUM_LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 4
BYTES_PER_TOKEN = NUM_LAYERS * 2 * KV_HEADS * HEAD_DIM * 4  # float32 keys and values


def fake_kv(token_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV whose every position encodes (layer, token id, position): a wrong slice or order shows."""
    n = len(token_ids)
    ids = torch.tensor(token_ids, dtype=torch.float32)
    pos = torch.arange(n, dtype=torch.float32)
    layers = []
    for layer in range(NUM_LAYERS):
        k = (1000 * layer + ids + pos / 1000)[None, :, None].expand(KV_HEADS, n, HEAD_DIM).clone()
        layers.append((k, -k))
    return layers


def assert_kv_equal(actual, expected) -> None:
    assert len(actual) == len(expected)
    for (k, v), (ek, ev) in zip(actual, expected):
        torch.testing.assert_close(k, ek, rtol=0, atol=0)
        torch.testing.assert_close(v, ev, rtol=0, atol=0)


def test_empty_cache_misses():
    cache = PrefixCache(1 << 20)
    assert cache.match([1, 2, 3]) == (0, None)
    assert cache.stats()["misses"] == 1 and cache.stats()["hit_rate"] == 0.0


def test_match_returns_the_longest_prefix_with_its_kv():
    cache = PrefixCache(1 << 20)
    seq = [5, 6, 7, 8, 9]
    cache.insert(seq, fake_kv(seq))
    for query, expected in ([5, 6, 7, 8, 9, 10], 5), ([5, 6, 7, 8, 9], 5), ([5, 6, 7, 1], 3), ([5], 1), ([6, 5], 0):
        num_tokens, layers = cache.match(query)
        assert num_tokens == expected
        if expected:
            assert_kv_equal(layers, fake_kv(seq[:expected]))
        else:
            assert layers is None


def test_insert_stores_only_the_new_suffix():
    cache = PrefixCache(1 << 20)
    turn1 = [1, 2, 3, 4]
    turn2 = turn1 + [5, 6, 7]
    cache.insert(turn1, fake_kv(turn1))
    cache.insert(turn2, fake_kv(turn2))
    assert cache.stats()["num_stored_tokens"] == 7
    assert cache.num_bytes == 7 * BYTES_PER_TOKEN
    num_tokens, layers = cache.match(turn2 + [8])
    assert num_tokens == 7
    assert_kv_equal(layers, fake_kv(turn2))
    cache.insert(turn2, fake_kv(turn2))  # all known: nothing added
    cache.insert(turn1[:2], fake_kv(turn1[:2]))
    assert cache.stats()["num_stored_tokens"] == 7 and cache.stats()["num_entries"] == 2


def test_branches_each_match_their_own_prefix():
    cache = PrefixCache(1 << 20)
    a = [1, 2, 3, 4, 5, 6]
    b = [1, 2, 3, 9, 9]  # diverges inside a's edge: the edge is split at 3
    cache.insert(a, fake_kv(a))
    cache.insert(b, fake_kv(b))
    assert cache.stats()["num_stored_tokens"] == 8  # 3 shared + 3 + 2
    assert cache.num_bytes == 8 * BYTES_PER_TOKEN
    for seq in (a, b):
        num_tokens, layers = cache.match(seq + [0])
        assert num_tokens == len(seq)
        assert_kv_equal(layers, fake_kv(seq))
    num_tokens, layers = cache.match([1, 2, 3, 7])
    assert num_tokens == 3
    assert_kv_equal(layers, fake_kv([1, 2, 3]))


def test_stored_tensors_do_not_pin_the_callers_buffers():
    """A stored suffix is its own tensor, so the byte count is what memory is actually held."""
    cache = PrefixCache(1 << 20)
    turn1, turn2 = [1, 2], [1, 2, 3, 4, 5]
    cache.insert(turn1, fake_kv(turn1))
    cache.insert(turn2, fake_kv(turn2))
    held = sum(t.untyped_storage().nbytes() for node in cache._nodes for kv in node.layers for t in kv)
    assert held == cache.num_bytes == 5 * BYTES_PER_TOKEN


def test_lru_evicts_least_recently_used_leaf_within_budget():
    cache = PrefixCache(10 * BYTES_PER_TOKEN)
    a, b, c = [1] * 4, [2] * 4, [3] * 4
    cache.insert(a, fake_kv(a))
    cache.insert(b, fake_kv(b))
    cache.match(a + [0])  # a is now more recent than b
    cache.insert(c, fake_kv(c))  # 12 tokens > 10: the least recently used (b) goes
    assert cache.match(b)[0] == 0
    assert cache.match(a)[0] == 4 and cache.match(c)[0] == 4
    assert cache.stats()["num_evictions"] == 1
    assert cache.num_bytes == 8 * BYTES_PER_TOKEN <= cache.max_bytes


def test_eviction_never_takes_the_path_being_extended():
    cache = PrefixCache(10 * BYTES_PER_TOKEN)
    old, other = [1, 2, 3, 4, 5, 6], [9, 9]
    cache.insert(other, fake_kv(other))
    cache.insert(old, fake_kv(old))
    longer = old + [7, 8, 9, 10, 11, 12]  # 12 tokens: everything evictable goes, then it is cut to fit
    cache.insert(longer, fake_kv(longer))
    num_tokens, layers = cache.match(longer)
    assert num_tokens == 10
    assert_kv_equal(layers, fake_kv(longer[:10]))
    assert cache.match(other)[0] == 0
    assert cache.num_bytes == cache.max_bytes


def test_a_shared_prefix_stays_when_its_other_branch_is_evicted():
    cache = PrefixCache(8 * BYTES_PER_TOKEN)
    a = [1, 2, 3, 4, 5]
    b = [1, 2, 3] + [6] * 6  # splits a's edge at 3, then needs a's tail evicted and still more room
    cache.insert(a, fake_kv(a))
    cache.insert(b, fake_kv(b))
    num_tokens, layers = cache.match(b)
    assert num_tokens == 8
    assert_kv_equal(layers, fake_kv(b[:8]))
    assert cache.match(a)[0] == 3


def test_parents_become_evictable_once_their_children_are_gone():
    cache = PrefixCache(8 * BYTES_PER_TOKEN)
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 6, 7]  # shared node [1,2,3] with two leaves
    cache.insert(a, fake_kv(a))
    cache.insert(b, fake_kv(b))
    big = [8] * 8
    cache.insert(big, fake_kv(big))  # needs the whole budget: both leaves, then their parent, go
    assert cache.match(big)[0] == 8
    assert cache.match(a)[0] == 0
    assert cache.stats()["num_entries"] == 1 and cache.num_bytes == 8 * BYTES_PER_TOKEN


def test_a_suffix_larger_than_the_budget_keeps_its_leading_part():
    cache = PrefixCache(6 * BYTES_PER_TOKEN + BYTES_PER_TOKEN // 2)
    seq = list(range(10))
    cache.insert(seq, fake_kv(seq))
    num_tokens, layers = cache.match(seq)
    assert num_tokens == 6
    assert_kv_equal(layers, fake_kv(seq[:6]))
    assert cache.num_bytes == 6 * BYTES_PER_TOKEN


def test_budget_is_never_exceeded_under_random_traffic():
    generator = torch.Generator().manual_seed(0)
    cache = PrefixCache(50 * BYTES_PER_TOKEN)
    for _ in range(200):
        length = int(torch.randint(1, 30, (1,), generator=generator))
        seq = torch.randint(0, 3, (length,), generator=generator).tolist()  # small alphabet: many shared prefixes
        num_tokens, layers = cache.match(seq)
        if num_tokens:
            assert_kv_equal(layers, fake_kv(seq[:num_tokens]))
        cache.insert(seq, fake_kv(seq))
        assert cache.num_bytes <= cache.max_bytes
        assert cache.num_bytes == sum(layer_kv_nbytes(node.layers) for node in cache._nodes)
    assert cache.stats()["num_evictions"] > 0 and cache.stats()["hits"] > 0


def test_stats_count_hits_misses_and_reused_tokens():
    cache = PrefixCache(1 << 20)
    seq = [1, 2, 3, 4]
    cache.insert(seq, fake_kv(seq))
    cache.match([1, 2, 9])
    cache.match(seq)
    cache.match([7])
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["num_cached_tokens"]) == (2, 1, 6)
    assert stats["hit_rate"] == pytest.approx(2 / 3)
    assert stats["num_bytes"] == 4 * BYTES_PER_TOKEN and stats["max_bytes"] == 1 << 20
    cache.clear()
    assert cache.match(seq) == (0, None)
    assert cache.stats()["num_bytes"] == 0 and cache.stats()["num_entries"] == 0


def test_zero_budget_disables_the_cache():
    cache = PrefixCache(0)
    cache.insert([1, 2], fake_kv([1, 2]))
    assert cache.match([1, 2, 3]) == (0, None)
    assert cache.stats()["num_bytes"] == 0 and cache.stats()["num_entries"] == 0


def test_bad_input_is_rejected_and_loses_nothing():
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2], fake_kv([1, 2]))
    with pytest.raises(ValueError, match="must be"):
        cache.insert([1, 2, 3], fake_kv([1, 2]))  # KV for 2 positions, 3 ids
    other_layout = [(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))]
    with pytest.raises(ValueError, match="layout"):
        cache.insert([1, 2, 3], other_layout)
    with pytest.raises(ValueError, match=">= 0"):
        PrefixCache(-1)
    assert cache.match([1, 2])[0] == 2 and cache.stats()["num_stored_tokens"] == 2


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
    return engine_for(arch, prefix_cache_bytes=64 << 20)


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
    return Engine(bundled, EngineConfig(prefix_cache_bytes=64 << 20))


def chat_ids(engine: Engine, messages: list[dict]) -> list[int]:
    return engine.encode(engine.render_chat(messages).text)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_bundled_chat_turns_reuse_the_prefix(bundled_engine, sampling):
    engine = bundled_engine
    engine.prefix_cache.clear()
    params = dict(max_new_tokens=8, **SAMPLINGS[sampling])
    question = {"role": "user", "content": "Name three colours."}
    turn1_ids = chat_ids(engine, [question])
    _, turn1 = generate(engine, turn1_ids, **params)
    answer_ids = [s.token_id for s in turn1]
    answer_text = engine.tokenizer.decode(answer_ids, skip_special_tokens=True)

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

    branch_ids = turn1_ids + answer_ids[:3] + [engine.encode(" zebra")[0]]
    assert_same_as_uncached(engine, branch_ids, len(turn1_ids) + 3, **params)
    stats = engine.prefix_cache_stats()
    assert stats["hits"] == 4 and stats["num_bytes"] <= stats["max_bytes"]
    assert stats["num_cached_tokens"] > len(turn2_ids)


def test_bundled_cache_budget_is_enforced_by_the_engine(bundled):
    engine = Engine(bundled, EngineConfig(prefix_cache_bytes=40 * 46080))  # 40 tokens of float32 KV
    assert engine.kv_bytes_per_token() == 46080
    sentence = "The sea was calm and grey under a low sky that morning. "
    prompt = chat_ids(engine, [{"role": "user", "content": sentence * 4}])
    assert len(prompt) > 60  # more than the budget holds
    generate(engine, prompt, greedy=True, max_new_tokens=4)
    stats = engine.prefix_cache_stats()
    assert stats["num_bytes"] == stats["max_bytes"] and stats["num_stored_tokens"] == 40
    prefilled, _ = generate(engine, prompt, greedy=True, max_new_tokens=1)
    assert prefilled.num_cached_tokens == 40  # the leading part was kept
