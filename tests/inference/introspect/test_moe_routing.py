"""MoE routing captured from the gate modules: equal to a recomputation from the router logits,
group-limited, weights summing to the routing scale, hooks gone afterwards."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.introspect import moe
from inference.models.demo import DEMO_SEED, demo_config
from inference.models.tiny import make_tiny_model

TOKENS = [5, 17, 200, 3, 99, 42, 7, 7, 150, 260, 11, 64]


def demo_like_model() -> torch.nn.Module:
    """The demo's architecture (16 experts, 4 groups, 2 kept, 4 chosen) at a small vocabulary."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DEMO_SEED)
        model = AutoModelForCausalLM.from_config(demo_config(320, 0, 1), dtype=torch.float32).eval()
        for _, router in moe.find_routers(model):
            router.e_score_correction_bias.data.normal_(0.0, 0.05)
            router.weight.data.normal_(0.0, 0.2)
    return model


@pytest.fixture(params=["tiny", "demo"])
def model(request) -> torch.nn.Module:
    return make_tiny_model("deepseek_v3") if request.param == "tiny" else demo_like_model()


def test_captured_choices_equal_a_recomputation(model) -> None:
    routers = moe.find_routers(model)
    assert routers and [layer for layer, _ in routers] == list(range(1, model.config.num_hidden_layers))
    with moe.capture_routing(model) as captured, torch.inference_mode():
        model(input_ids=torch.tensor([TOKENS]), use_cache=False)
    for layer, router in routers:
        got = captured[layer]
        weights, indices = moe.recompute_routing(
            got["logits"], router.e_score_correction_bias, **moe.router_settings(router)
        )
        assert torch.equal(got["indices"].sort(dim=-1).values, indices.sort(dim=-1).values)
        order_got, order_new = got["indices"].argsort(dim=-1), indices.argsort(dim=-1)
        torch.testing.assert_close(got["weights"].gather(1, order_got), weights.gather(1, order_new))


def test_group_limit_and_weight_sum(model) -> None:
    trace = moe.routing_trace(model, TOKENS, first_position=2)
    assert [t["position"] for t in trace["tokens"]] == list(range(2, len(TOKENS)))
    assert trace["layers"][0] == trace["first_k_dense_replace"] == model.config.first_k_dense_replace
    for token in trace["tokens"]:
        for choice in token["layers"]:
            assert len(choice["experts"]) == trace["num_experts_per_tok"] == len(set(choice["experts"]))
            groups = {e // trace["experts_per_group"] for e in choice["experts"]}
            assert sorted(groups) == choice["groups"] and len(groups) <= trace["topk_group"]
            assert sum(choice["weights"]) == pytest.approx(trace["routed_scaling_factor"], abs=1e-3)
            assert choice["weights"] == sorted(choice["weights"], reverse=True)
    chosen = {e for t in trace["tokens"] for c in t["layers"] for e in c["experts"]}
    assert len(chosen) > trace["num_experts_per_tok"]  # routing differs between tokens and layers


def test_bias_only_chooses() -> None:
    """A huge bias on one expert makes it chosen everywhere, yet its weight is its plain score."""
    model = make_tiny_model("deepseek_v3")
    layer, router = moe.find_routers(model)[0]
    router.e_score_correction_bias.data[:] = 0
    router.e_score_correction_bias.data[3] = 100.0
    with moe.capture_routing(model) as captured, torch.inference_mode():
        model(input_ids=torch.tensor([TOKENS]), use_cache=False)
    got = captured[layer]
    assert (got["indices"] == 3).any(dim=-1).all()
    scores = got["logits"].sigmoid()
    picked = scores.gather(1, got["indices"])
    expected = picked / picked.sum(dim=-1, keepdim=True) * router.routed_scaling_factor
    torch.testing.assert_close(got["weights"], expected)


def test_hooks_are_removed_even_after_an_error(model) -> None:
    routers = [router for _, router in moe.find_routers(model)]
    with pytest.raises(RuntimeError), moe.capture_routing(model):
        assert all(len(r._forward_hooks) == 1 for r in routers)
        raise RuntimeError("boom")
    assert all(len(r._forward_hooks) == 0 for r in routers)
    moe.routing_trace(model, TOKENS)
    assert all(len(r._forward_hooks) == 0 for r in routers)


def test_a_dense_model_has_nothing_to_trace() -> None:
    with pytest.raises(moe.NotMoE, match="no mixture-of-experts"):
        moe.routing_trace(make_tiny_model("llama"), TOKENS)
