"""Every architecture runs in the batch: tokens in a mixed batch equal transformers' own greedy
decoding on tiny random models (GPT-2, Llama, Qwen2, DeepSeek-V3's MLA + MoE, Gemma-3's
sliding-window layers); parallel sampling prefills once; beams share the batch with others."""

from __future__ import annotations

import pytest
import torch

from inference import Finished, Prefilled, SamplingParams, Step
from inference.models.tiny import make_tiny_model
from tests.inference.engines import engine_around, engine_for, hf_greedy

ARCHS = ["gpt2", "llama", "qwen2", "deepseek_v3", "gemma3"]
PROMPTS = [[5, 77, 130, 9, 200, 41, 17, 3, 99, 150, 12], [40, 41, 42], [7] * 23, [250, 2, 90, 90, 16, 31]]


def step_all(engine, ids: list[int]) -> dict[int, list]:
    events: dict[int, list] = {i: [] for i in ids}
    while engine.has_unfinished:
        for request_id, event in engine.step():
            events[request_id].append(event)
    return events


def tokens(events: list) -> list[int]:
    return [e.token_id for e in events if isinstance(e, Step)]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_mixed_batch_equals_transformers_greedy(arch: str) -> None:
    """Prompts of different lengths, chunked (a 7-token budget) beside each other's decodes."""
    engine = engine_for(arch, max_num_batched_tokens=7)
    params = SamplingParams(greedy=True, max_new_tokens=10, ignore_eos=True, num_alternatives=3)
    ids = [engine.add_request(prompt, params) for prompt in PROMPTS]
    events = step_all(engine, ids)
    for prompt, request_id in zip(PROMPTS, ids):
        assert tokens(events[request_id]) == hf_greedy(engine.model, prompt, 10, ()), (arch, prompt)
        assert isinstance(events[request_id][0], Prefilled) and isinstance(events[request_id][-1], Finished)
    step = engine.last_batch_step
    assert step is not None and step.num_batched_tokens <= 7


def test_gemma3_sliding_window_is_respected_past_the_window() -> None:
    """The tiny Gemma-3's window is 6 tokens: a 23-token prompt must be masked, not just cached."""
    model = make_tiny_model("gemma3")
    assert model.config.sliding_window == 6
    engine = engine_around(model)
    prompt = PROMPTS[2][:10] + PROMPTS[0]
    events = step_all(engine, [engine.add_request(prompt, SamplingParams(greedy=True, max_new_tokens=8))])
    assert tokens(next(iter(events.values()))) == hf_greedy(model, prompt, 8, ())


def test_the_mla_pool_holds_the_latent_not_the_expanded_heads() -> None:
    engine = engine_for("deepseek_v3")
    config = engine.model.config
    pool = engine.runner.pool
    assert pool.key_shape == (1, config.kv_lora_rank) and pool.value_shape == (1, config.qk_rope_head_dim)
    per_token = config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 4  # float32
    assert engine.info.kv_bytes_per_token == per_token


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_choices_share_one_prefill_and_draw_their_own_tokens(arch: str) -> None:
    engine = engine_for(arch)
    params = SamplingParams(temperature=1.0, seed=7, max_new_tokens=8, ignore_eos=True)
    ids = engine.add_choices(PROMPTS[0], params, 3)
    events = step_all(engine, ids)
    prefilled = [events[i][0] for i in ids]
    assert prefilled[0].num_prefilled_tokens == len(PROMPTS[0])
    assert [p.num_prefilled_tokens for p in prefilled[1:]] == [0, 0]  # the prompt ran once
    assert [p.num_cached_tokens for p in prefilled[1:]] == [len(PROMPTS[0])] * 2
    drawn = [tokens(events[i]) for i in ids]
    assert len({tuple(t) for t in drawn}) > 1  # seeds 7, 8, 9: their own draws
    for i, choice in enumerate(drawn):  # each equals the same request alone with its seed
        alone = engine_for(arch)
        params_i = SamplingParams(temperature=1.0, seed=7 + i, max_new_tokens=8, ignore_eos=True)
        assert tokens(list(alone.generate(PROMPTS[0], params_i))) == choice
    # the forks' first logits row is the leader's: the same raw distribution at step 0
    first_rows = [[a.token_id for a in events[i][1].top_raw] for i in ids]
    assert first_rows[0] == first_rows[1] == first_rows[2]
    assert engine.core.block_manager.num_used_blocks == 0


def test_cancelling_the_leader_before_it_forked_ends_every_choice() -> None:
    engine = engine_for("llama")
    ids = engine.add_choices(PROMPTS[2], SamplingParams(max_new_tokens=4), 3)
    engine.cancel(ids[0])
    events = step_all(engine, ids)
    assert [events[i][-1].finish_reason for i in ids] == ["cancelled"] * 3


def test_beams_decode_in_the_same_steps_as_other_requests() -> None:
    engine = engine_for("llama")
    greedy = SamplingParams(greedy=True, max_new_tokens=8, ignore_eos=True)
    beams = SamplingParams(num_beams=3, max_new_tokens=6, ignore_eos=True)
    ids = [engine.add_request(PROMPTS[0], greedy), engine.add_request(PROMPTS[1], beams)]
    seen_together = False
    events: dict[int, list] = {i: [] for i in ids}
    while engine.has_unfinished:
        for request_id, event in engine.step():
            events[request_id].append(event)
        step = engine.last_batch_step
        seen_together |= step is not None and {c["request_id"] for c in step.chunks} == set(ids)
    assert seen_together
    assert tokens(events[ids[0]]) == hf_greedy(engine.model, PROMPTS[0], 8, ())
    with torch.inference_mode():
        expected = engine.model.generate(
            torch.tensor([PROMPTS[1]]), num_beams=3, max_new_tokens=6, do_sample=False, pad_token_id=0
        )[0, len(PROMPTS[1]) :].tolist()
    assert list(events[ids[1]][-1].token_ids) == expected
    assert engine.core.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["gpt2", "gemma3"])
def test_the_transformers_runner_multiplies_on_the_kernels_by_default_and_on_torch_in_the_fast_mode(arch) -> None:
    """Every large linear layer reads its weight once per step for all its rows (issue 22: Gemma-3's
    output layer on torch's GEMM took 3x one row's time at 4 rows); fast mode keeps torch's."""
    from inference.kernels import cpu as cpu_kernels
    from inference.models.matmul import MIN_KERNEL_ELEMENTS, route_linears

    if cpu_kernels.load() is None:
        pytest.skip("no C compiler: the kernels are not built")
    engine = engine_for(arch)
    linears = [m for m in engine.model.modules() if type(m) is torch.nn.Linear]
    large = [m for m in linears if m.weight.numel() >= MIN_KERNEL_ELEMENTS]
    assert engine.runner.hf.num_kernel_linears == len(large)
    assert [m for m in linears if "forward" in vars(m)] == large
    model = make_tiny_model(arch)
    assert route_linears(model, min_elements=0) == len(linears) > 0
    layer = [m for m in model.modules() if type(m) is torch.nn.Linear][-1]
    x = torch.randn(3, layer.in_features)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert "forward" in vars(layer) and torch.allclose(layer(x[None])[0], expected, atol=1e-5)
    assert torch.equal(layer(x[:1])[0], layer(x)[0])  # a row's numbers do not depend on what shares the call
    fast = engine_for(arch, batch_invariant=False)
    assert fast.runner.hf.num_kernel_linears == 0
    assert not any("forward" in vars(m) for m in fast.model.modules() if type(m) is torch.nn.Linear)


def test_with_a_step_time_goal_a_long_prompt_is_cut_small_and_a_newcomer_answers_in_the_next_step() -> None:
    """max_step_ms (core.pacer): once a prefill step was measured, steps shrink to the goal (here
    below any step: the scheduler's floor), so another client's first token is one step away."""
    from inference.core.scheduler import MIN_PREFILL_TOKENS

    engine = engine_for("llama", max_step_ms=1e-6, max_num_batched_tokens=64)
    params = SamplingParams(greedy=True, max_new_tokens=4, ignore_eos=True)
    long = engine.add_request([(i * 7) % 250 + 3 for i in range(200)], params, client="a")
    engine.step()
    assert engine.last_batch_step.num_batched_tokens == 64  # nothing measured before it
    engine.step()
    assert engine.last_batch_step.token_budget == MIN_PREFILL_TOKENS
    newcomer = engine.add_request([5, 6, 7, 8, 9], params, client="b")
    events = engine.step()
    assert any(rid == newcomer and isinstance(e, Step) for rid, e in events)  # its first token, now
    assert engine.last_batch_step.num_batched_tokens <= MIN_PREFILL_TOKENS + 1
    finished = step_all(engine, [long, newcomer])
    assert len(tokens(finished[long])) == 4 and len(tokens(finished[newcomer])) == 3
