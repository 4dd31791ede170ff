"""The worker's MoE trace of a finished generation: its tokens, through the engine loop, to the
reply channel; equal to tracing the same ids directly; refusals as error answers."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from inference.introspect.moe import routing_trace
from playground.models import Generation
from playground.worker import moe_routing
from tests.engine.engines import engine_for
from tests.playground.conftest import make_generation

PROMPT, GENERATED = [72, 105, 33, 10], [65, 66, 67]


def finished_row(session_key: str) -> Generation:
    return make_generation(
        session_key,
        status=Generation.Status.FINISHED,
        prompt={"tokens": [{"id": i} for i in PROMPT]},
        steps=[{"token_id": i} for i in GENERATED],
    )


def answer_for(generation_id: int, engine) -> dict:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    moe_routing.run_moe_routing(generation_id, channel, load_engine=lambda model: engine)
    return async_to_sync(layer.receive)(channel)


def test_trace_of_a_generation(session_key: str) -> None:
    engine = engine_for("deepseek_v3")
    row = finished_row(session_key)
    answer = answer_for(row.pk, engine)
    assert answer["type"] == "inspection.result" and answer["ok"], answer
    result = answer["result"]
    assert [t["token_id"] for t in result["tokens"]] == GENERATED
    assert result["tokens"] == routing_trace(engine.runner.model, PROMPT + GENERATED, len(PROMPT))["tokens"]


def test_refusals_are_answers(session_key: str) -> None:
    dense = answer_for(finished_row(session_key).pk, engine_for("llama"))
    assert (dense["ok"], dense["code"]) == (False, "invalid_params") and "no mixture-of-experts" in dense["message"]
    running = make_generation(session_key, status=Generation.Status.RUNNING)
    assert answer_for(running.pk, engine_for("deepseek_v3"))["code"] == "invalid_params"
    assert answer_for(10**6, engine_for("deepseek_v3"))["code"] == "not_found"
