"""The "moe" inspection on the demo DeepSeek-V3 model (its real architecture, its seeded random
weights): per step, the experts each MoE layer chose equal V3's rule recomputed from the router
logits and the routing captured during the real generation; at most `topk_group` groups;
weights summing to the routing scale; hooks gone afterwards; a dense model gets `not_moe`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from django.conf import settings
from transformers import AutoTokenizer

from inference import EngineConfig
from inference.engine import Engine
from inference.introspect import moe
from inference.models import demo
from inference.models.bundled import ensure_bundled_model
from inference.models.loader import LoadedModel
from tests.playground.worker.test_inspect import ask, finished

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def demo_engine() -> Engine:
    """The demo model as `manage.py demo_model` builds it, in memory (nothing written to the data dir)."""
    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model(settings.PLAYGROUND_DATA_DIR))
    model = demo.build_demo_model(tokenizer)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=demo.DEMO_MODEL_NAME,
        source_path=Path("."),
        dtype=torch.float32,
        device=torch.device("cpu"),
        chat_template=None,
        max_context=256,
        eos_token_ids=(),  # random weights may write EOS at any step: the tests want every step
    )
    engine = Engine(loaded, EngineConfig())
    engine.model_info()  # its one-token measuring pass now, not among the generation's passes
    return engine


@contextmanager
def routing_of_every_pass(model: torch.nn.Module) -> Iterator[dict[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Per MoE layer, the (experts, weights) of the last position of every forward pass, in
    order: during a generation, the routing that predicted each step."""
    passes: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    handles = []
    for layer, router in moe.find_routers(model):
        passes[layer] = []

        def hook(module, inputs, output, layer=layer) -> None:
            _, weights, indices = output  # (tokens, k) each
            passes[layer].append((indices[-1].clone(), weights[-1].clone()))

        handles.append(router.register_forward_hook(hook))
    try:
        yield passes
    finally:
        for handle in handles:
            handle.remove()


def test_routing_of_each_step_is_the_generations_own(owner: str, demo_engine: Engine) -> None:
    model = demo_engine.model
    with routing_of_every_pass(model) as during:
        row = finished(owner, engine=demo_engine)
    answer = ask(row, engine=demo_engine, view="moe")
    assert answer["ok"], answer
    result = answer["result"]
    config = model.config
    assert demo_engine.model_info()["num_moe_layers"] == len(result["layers"]) == 3
    assert (result["n_routed_experts"], result["n_group"], result["topk_group"]) == (16, 4, 2)
    assert (result["num_experts_per_tok"], result["routed_scaling_factor"]) == (4, 2.5)
    assert result["first_k_dense_replace"] == config.first_k_dense_replace == result["layers"][0] == 1
    assert result["layers"] == list(range(1, config.num_hidden_layers))
    assert [t["sampled_token_id"] for t in result["tokens"]] == [s["token_id"] for s in row.steps]
    assert [t["step"] for t in result["tokens"]] == list(range(len(row.steps))) and result["num_steps"] == 6
    for step, token in enumerate(result["tokens"]):
        assert token["sampled_piece"] == row.steps[step]["piece"]
        for layer, choice in zip(result["layers"], token["layers"]):
            experts, weights = during[layer][step]
            assert sorted(choice["experts"]) == sorted(experts.tolist())
            got = dict(zip(choice["experts"], choice["weights"]))
            assert [got[e] for e in experts.tolist()] == pytest.approx(weights.tolist(), abs=1e-4)


def test_choices_equal_v3s_rule_from_the_router_logits(owner: str, demo_engine: Engine) -> None:
    model = demo_engine.model
    row = finished(owner, engine=demo_engine)
    result = ask(row, engine=demo_engine, view="moe")["result"]
    routers = moe.find_routers(model)
    assert all(not router._forward_hooks for _, router in routers)  # the inspection's hooks are gone
    ids = [t["id"] for t in row.prompt["tokens"]] + [s["token_id"] for s in row.steps[:-1]]
    with moe.capture_routing(model) as captured, torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    first = row.num_prompt_tokens - 1  # the position that predicted step 0
    for index, (layer, router) in enumerate(routers):
        logits = captured[layer]["logits"][first:]  # (steps, experts)
        weights, experts = moe.recompute_routing(logits, router.e_score_correction_bias, **moe.router_settings(router))
        for step, token in enumerate(result["tokens"]):
            choice = token["layers"][index]
            assert sorted(choice["experts"]) == sorted(experts[step].tolist())
            got = dict(zip(choice["experts"], choice["weights"]))
            assert [got[e] for e in experts[step].tolist()] == pytest.approx(weights[step].tolist(), abs=1e-4)
            assert len(choice["groups"]) <= result["topk_group"]
            assert choice["groups"] == sorted({e // result["experts_per_group"] for e in choice["experts"]})
            assert sum(choice["weights"]) == pytest.approx(result["routed_scaling_factor"], abs=1e-3)


def test_a_dense_model_is_not_moe(owner: str) -> None:
    answer = ask(finished(owner), view="moe")
    assert (answer["ok"], answer["code"]) == (False, "not_moe")
    assert "dense" in answer["message"] and "mixture-of-experts" in answer["message"]
