"""Each step's MoE routing, captured from the generation's own forward passes: equal to the
teacher-forced "moe" inspection's, following V3's rule from the router logits of that very
pass, hooks gone after every pass; a dense model's steps carry none and it is never hooked."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inference import EngineConfig, SamplingParams, Step
from inference.engine import Engine
from inference.introspect import moe
from tests.inference.engines import engine_for, run
from tests.inference.introspect.test_moe_routing import demo_like_model

PROMPT = [5, 77, 130, 9, 200, 41]
ONE_UNIT = 1e-5 + 1e-9  # both sides are rounded to 5 decimals: a float difference can flip the last one


def moe_engine(kind: str) -> Engine:
    """The tiny V3 (4 experts, 2 groups, 1 kept, 2 chosen) or the demo's routing (16, 4, 2, 4)."""
    tiny = engine_for("deepseek_v3")
    if kind == "tiny":
        return tiny
    return Engine(replace(tiny.loaded, model=demo_like_model(), name="demo-like"), EngineConfig())


@pytest.mark.parametrize("kind", ["tiny", "demo"])
@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_streamed_routing_equals_the_inspection(kind: str, use_kv_cache: bool) -> None:
    engine = moe_engine(kind)
    _, steps, finished = run(
        engine, PROMPT, max_new_tokens=10, ignore_eos=True, seed=3, temperature=1.0, use_kv_cache=use_kv_cache
    )
    generated = list(finished.token_ids)
    # the inspection's positions: the prompt's last token, then every generated token but the last
    trace = moe.routing_trace(engine.model, PROMPT + generated[:-1], first_position=len(PROMPT) - 1)
    assert len(trace["tokens"]) == len(steps) == 10
    for step, token in zip(steps, trace["tokens"]):
        assert [c["layer"] for c in step.moe_routing] == trace["layers"]
        for streamed, inspected in zip(step.moe_routing, token["layers"]):
            assert streamed["experts"] == inspected["experts"]
            assert streamed["groups"] == inspected["groups"]
            assert streamed["weights"] == pytest.approx(inspected["weights"], abs=ONE_UNIT)
    routers = [router for _, router in engine.runner.routing.routers]
    assert all(len(r._forward_hooks) == 0 for r in routers)  # removed after every pass
    chosen = {e for s in steps for c in s.moe_routing for e in c["experts"]}
    assert len(chosen) > trace["num_experts_per_tok"]  # the routing moves: equality is not trivial


@pytest.mark.parametrize("kind", ["tiny", "demo"])
def test_each_step_follows_the_rule_from_its_own_router_logits(kind: str) -> None:
    """An outer hook sees the same pass as the engine's: the step's choice is V3's rule applied
    to that pass's last-position router logits."""
    engine = moe_engine(kind)
    settings = engine.runner.routing.settings
    events = engine.generate(PROMPT, SamplingParams(max_new_tokens=8, ignore_eos=True, greedy=True))
    num_steps = 0
    with moe.capture_routing(engine.model) as captured:
        for event in events:
            if not isinstance(event, Step):
                continue
            num_steps += 1
            for choice, (layer, router) in zip(event.moe_routing, engine.runner.routing.routers):
                weights, indices = moe.recompute_routing(
                    captured[layer]["logits"][-1:], router.e_score_correction_bias, **moe.router_settings(router)
                )
                # the rule lists experts by biased score, the record by weight: compare as expert -> weight
                expected = dict(zip(indices[0].tolist(), weights[0].tolist()))
                assert sorted(choice["experts"]) == sorted(expected)
                assert choice["weights"] == pytest.approx([expected[e] for e in choice["experts"]], abs=ONE_UNIT / 2)
                assert choice["weights"] == sorted(choice["weights"], reverse=True)
                assert len(choice["groups"]) <= settings["topk_group"]
                assert {e // settings["experts_per_group"] for e in choice["experts"]} == set(choice["groups"])
                assert sum(choice["weights"]) == pytest.approx(settings["routed_scaling_factor"], abs=1e-4)
    assert num_steps == 8
    assert engine.model_info()["moe"] == settings and engine.model_info()["num_moe_layers"] == len(settings["layers"])


@pytest.mark.parametrize(("arch", "runner"), [("llama", "lean-llama"), ("gpt2", "transformers")])
def test_a_dense_model_is_never_hooked(arch: str, runner: str, monkeypatch) -> None:
    engine = engine_for(arch)
    assert engine.runner.name == runner and not engine.runner.routing
    hooked: list[torch.nn.Module] = []
    real = torch.nn.Module.register_forward_hook
    monkeypatch.setattr(
        torch.nn.Module, "register_forward_hook", lambda self, *a, **k: hooked.append(self) or real(self, *a, **k)
    )
    _, steps, _ = run(engine, PROMPT, max_new_tokens=4, ignore_eos=True, greedy=True)
    _, no_cache_steps, _ = run(engine, PROMPT, max_new_tokens=2, ignore_eos=True, greedy=True, use_kv_cache=False)
    assert hooked == []
    assert all(s.moe_routing is None for s in steps + no_cache_steps)
    assert steps[0].to_dict()["moe_routing"] is None
    assert engine.model_info()["moe"] is None and engine.model_info()["num_moe_layers"] == 0
