"""Inspections of a finished generation: the worker side on a tiny real model (its answers
against the generation's own stored steps), and the HTTP path with the reply channel."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

import pytest
import torch
from channels.layers import get_channel_layer
from django.test import AsyncClient

from inference.engine import Engine
from inference.introspect import architecture
from inference.introspect.recompute import recompute
from inference.sampling.logits import apply_processors, build_processors
from inference.sampling_params import SamplingParams
from playground import inspection
from playground.models import Generation, LanguageModel
from playground.web import inspect_api, submit
from playground.worker import generation, inspections
from tests.inference.engines import engine_for
from tests.playground.conftest import new_browser

pytestmark = pytest.mark.django_db

TINY = engine_for("llama")
SETTINGS = {
    "temperature": 1.2,
    "top_k": 40,
    "top_p": 0.9,
    "repetition_penalty": 1.0,  # not the default preset's: the stages below are these four
    "seed": 7,
    "max_new_tokens": 6,
    "num_alternatives": 10,
}


def finished(
    owner: str,
    token_ids: list[int] | None = None,
    text: str = "hello world",
    engine: Engine = TINY,
    **overrides: Any,
) -> Generation:
    if not LanguageModel.objects.exists():  # a transactional test starts with empty tables
        LanguageModel.objects.create(name="tiny", source="bundled", is_default=True)
    queued = submit.complete(
        owner, {"text": text, "token_ids": token_ids or [], "overrides": {**SETTINGS, **overrides}}
    )
    generation.run_generation(queued.generation_id, "w", load_engine=lambda model: engine, send=lambda event: None)
    row = Generation.objects.get(pk=queued.generation_id)
    assert row.status == Generation.Status.FINISHED, row.error_message
    return row


def ask(row: Generation, engine: Engine = TINY, **request: Any) -> dict[str, Any]:
    replies: list[tuple[str, dict[str, Any]]] = []
    checked = inspection.parse(request, row.params)
    inspections.run_inspection(
        row.pk, checked, "chan", load_engine=lambda model: engine, reply=lambda c, m: replies.append((c, m))
    )
    [(channel, message)] = replies
    assert channel == "chan" and message["type"] == "inspection.result"
    return message


def test_prompt_logprobs_need_only_the_prompt_so_beam_search_generations_have_them(owner: str) -> None:
    row = finished(owner, num_beams=2, num_return_sequences=1)
    assert ask(row, view="waterfall", step=0)["code"] == "invalid_params"  # several paths: no step to inspect
    reply = ask(row, view="prompt_logprobs", top_n=3)
    assert reply["ok"], reply
    prompt_ids = [int(token["id"]) for token in row.prompt["tokens"]]
    assert [t["token_id"] for t in reply["result"]["tokens"]] == prompt_ids


def test_waterfall_ends_in_the_distribution_the_step_was_sampled_from(owner: str) -> None:
    row = finished(owner)
    answer = ask(row, view="waterfall", step=2, top_n=10)
    assert answer["ok"], answer
    fall = answer["result"]
    assert [s["name"] for s in fall["stages"]] == ["raw", "temperature", "top_k", "top_p"]
    step = row.steps[2]
    assert fall["sampled_token_id"] == step["token_id"] and fall["sampled_piece"] == step["piece"]
    last = fall["stages"][-1]
    assert last["sampled"]["prob"] == pytest.approx(math.exp(step["logprob"]), rel=1e-3)
    stored = [a["token_id"] for a in step["top_processed"]]
    assert [t["token_id"] for t in last["top"]] == stored[: len(last["top"])]
    assert all("piece" in t for t in last["top"])


def test_what_if_with_the_generations_own_settings_replays_it(owner: str) -> None:
    row = finished(owner)
    result = ask(row, view="whatif")["result"]
    assert result["seed"] == 7 and result["diverged_at"] is None
    assert [s["token_id"] for s in result["steps"]] == [s["token_id"] for s in row.steps]
    changed = ask(row, view="whatif", params={"temperature": 0.0})["result"]
    assert changed["params"]["temperature"] == 0.0 and len(changed["original_probs"]) == len(row.steps)


def test_the_explorers_path_spans_its_earlier_requests(owner: str) -> None:
    first = finished(owner)
    earlier = [s["token_id"] for s in first.steps]
    second = finished(owner, token_ids=earlier)
    answer = ask(second, view="lens", step=len(earlier) + 1, layer=0)
    assert answer["ok"], answer
    seen = answer["result"]
    assert seen["num_steps"] == len(earlier) + len(second.steps)
    stored = second.steps[1]
    assert seen["lens"][-1]["top"][0]["token_id"] == stored["top_raw"][0]["token_id"]
    assert seen["lens"][-1]["top"][0]["prob"] == pytest.approx(stored["top_raw"][0]["prob"], rel=1e-3)
    assert seen["token_id"] == second.steps[0]["token_id"]  # the token read last before that step
    assert len(seen["attention"]["weights"][0]) == len(seen["context"]) == seen["position"] + 1
    assert seen["embedding"]["size"] == TINY.model.config.hidden_size


def test_kv_view_is_the_measured_cache(owner: str) -> None:
    row = finished(owner)
    result = ask(row, view="kv")["result"]
    assert result["shape"]["bytes_per_token"] == result["measured_bytes_per_token"] == TINY.info.kv_bytes_per_token
    num_tokens = row.num_prompt_tokens + len(row.steps) - 1
    assert result["request"]["total_bytes"] == num_tokens * TINY.info.kv_bytes_per_token


def test_roofline_view_places_the_recorded_phases(owner: str) -> None:
    row = finished(owner)
    result = ask(row, view="roofline")["result"]
    decode_steps = [s for s in row.steps if s["phase"] == "decode"]
    assert result["timeline"][:2] == [
        {"phase": "queue", "ms": row.stats["queue_ms"]},
        {"phase": "prefill", "ms": row.stats["prefill_ms"]},
    ]
    assert [(s["step"], s["ms"]) for s in result["timeline"][2:]] == [
        (s["index"], s["latency_ms"]) for s in decode_steps
    ]
    shape = architecture.shape_from_config(TINY.model.config.to_dict())
    prefill, decode = result["prefill"], result["decode"]
    cached = row.num_cached_tokens  # the prefix cache may hold an earlier test's prompt: attended, not computed
    assert prefill["flops"] == architecture.prefill_flops(shape, row.num_prompt_tokens, cached=cached, logits=1)
    assert prefill["ms"] == row.stats["prefill_ms"] and prefill["num_tokens"] == row.num_prompt_tokens - cached
    contexts = [row.num_prompt_tokens + s["index"] for s in decode_steps]
    assert decode["flops"] == sum(architecture.decode_flops(shape, c)["as_run"] for c in contexts)
    # the steps' own times (their forward passes), not the stream's wall time between its first and last token
    assert decode["ms"] == pytest.approx(sum(s["latency_ms"] for s in decode_steps))
    weights = sum(p.numel() * p.element_size() for p in TINY.model.parameters())
    unread = 0 if shape.tied_embeddings else (shape.vocab - 1) * shape.hidden * 4  # one embedding row is looked up
    assert decode["bytes"]["weights"] == len(decode_steps) * (weights - unread)  # every other weight, every step
    device = result["device"]
    assert device["ridge"] == device["matmul_flops_per_s"] / device["memory_bytes_per_s"] > 0
    assert device["device"] == "cpu" and device["dtype"] == "float32"


def test_bad_requests_are_refused_with_codes(owner: str) -> None:
    row = finished(owner)
    assert ask(row, view="waterfall", step=99)["code"] == "invalid_field"
    assert ask(row, view="lens", step=0, layer=50)["code"] == "invalid_field"
    with pytest.raises(inspection.CommandError, match="view"):
        inspection.parse({"view": "nope"}, {})
    with pytest.raises(inspection.CommandError, match="max_new_tokens"):
        inspection.parse({"view": "whatif", "params": {"max_new_tokens": 5}}, {})
    with pytest.raises(inspection.CommandError, match="temperature"):
        inspection.parse({"view": "whatif", "params": {"temperature": -1}}, {})


def test_ab_kl_is_the_two_processed_distributions(owner: str) -> None:
    a = finished(owner)
    b = finished(owner, temperature=0.7, top_k=0, top_p=1.0, seed=9)
    answer = ask(a, view="ab", other_generation_id=b.pk)
    assert answer["ok"], answer
    result = answer["result"]
    tokens_a, tokens_b = [s["token_id"] for s in a.steps], [s["token_id"] for s in b.steps]
    assert result["num_steps"] == min(len(tokens_a), len(tokens_b))
    flips = [x != y for x, y in zip(tokens_a, tokens_b)]
    assert [s["flipped"] for s in result["steps"]] == flips
    assert [(s["a_piece"], s["b_piece"]) for s in result["steps"]] == [
        (x["piece"], y["piece"]) for x, y in zip(a.steps, b.steps)
    ]
    # Step 0 reads the text alone: the KL of the two processed distributions, computed here.
    context, path = inspections.tokens_of(a)
    logits = recompute(TINY.model, context, path).logits(0)[None]
    ids = torch.tensor([context])
    lp_a, lp_b = (
        torch.log_softmax(apply_processors(build_processors(SamplingParams.from_dict(p)), logits, ids), -1)[0].double()
        for p in ({**a.params, "seed": 7}, {**b.params, "seed": 9})
    )
    kept = torch.isfinite(lp_a)
    direct = float((lp_a[kept].exp() * (lp_a[kept] - lp_b[kept])).sum())
    assert result["steps"][0]["kl"] == pytest.approx(direct, rel=1e-6)


def test_ab_of_the_same_settings_and_seed_has_no_flip(owner: str) -> None:
    a, b = finished(owner), finished(owner)
    result = ask(a, view="ab", other_generation_id=b.pk)["result"]
    assert result["first_flip"] is None and result["num_steps"] == len(a.steps)
    assert [(s["flipped"], s["kl"]) for s in result["steps"]] == [(False, 0.0)] * len(a.steps)


def test_ab_refuses_what_cannot_be_compared(owner: str) -> None:
    a = finished(owner)
    other_text = finished(owner, text="goodbye")
    assert ask(a, view="ab", other_generation_id=other_text.pk)["code"] == "not_comparable"
    other_model = finished(owner)
    other_model.model = LanguageModel.objects.create(name="other", source="bundled")
    other_model.save()
    assert ask(a, view="ab", other_generation_id=other_model.pk)["code"] == "not_comparable"
    running = finished(owner)
    Generation.objects.filter(pk=running.pk).update(status=Generation.Status.RUNNING)
    assert ask(a, view="ab", other_generation_id=running.pk)["code"] == "invalid_params"
    beams = finished(owner)
    Generation.objects.filter(pk=beams.pk).update(steps=[{"type": "beam_step", "index": 0, "beams": []}])
    assert ask(a, view="ab", other_generation_id=beams.pk)["code"] == "invalid_params"
    assert ask(a, view="ab", other_generation_id=10**6)["code"] == "not_found"
    with pytest.raises(inspection.CommandError, match="other_generation_id is required"):
        inspection.parse({"view": "ab"}, a.params)
    with pytest.raises(inspection.CommandError, match="send no params"):
        inspection.parse({"view": "ab", "other_generation_id": a.pk, "params": {"temperature": 1.0}}, a.params)


# ---- HTTP ---------------------------------------------------------------------------------


def _client(session_key: str) -> AsyncClient:
    client = AsyncClient()
    client.cookies["sessionid"] = session_key
    return client


async def _post(client: AsyncClient, generation_id: int, body: Any):
    return await client.post(
        f"/api/generations/{generation_id}/inspect/", data=json.dumps(body), content_type="application/json"
    )


@pytest.fixture
def worker_thread(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The task runs the real worker code in a thread (as Celery's thread pool would) and
    answers on the channel layer. The in-memory layer is not thread-safe (Redis is): the
    reply is handed to the test's event loop."""
    state: dict[str, Any] = {"loop": None}  # the test's event loop, set by the test

    def send_task(generation_id: int, checked: dict[str, Any], reply_channel: str) -> None:
        loop = state["loop"]

        def reply(channel: str, message: dict[str, Any]) -> None:
            asyncio.run_coroutine_threadsafe(get_channel_layer().send(channel, message), loop).result()

        kwargs = {"load_engine": lambda model: TINY, "reply": reply}
        threading.Thread(
            target=inspections.run_inspection, args=(generation_id, checked, reply_channel), kwargs=kwargs
        ).start()

    monkeypatch.setattr(inspect_api, "send_task", send_task)
    return state


@pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the worker thread reads the rows the test wrote
async def test_http_inspection_answers_from_the_worker(worker_thread: dict[str, Any]) -> None:
    from asgiref.sync import sync_to_async

    worker_thread["loop"] = asyncio.get_running_loop()
    session = await sync_to_async(new_browser)()
    row = await sync_to_async(finished)(session.owner)
    response = await _post(_client(session.session_key), row.pk, {"view": "waterfall", "step": 1})
    assert response.status_code == 200, response.content
    assert response.json()["stages"][-1]["sampled"]["prob"] == pytest.approx(
        math.exp(row.steps[1]["logprob"]), rel=1e-3
    )
    other = await sync_to_async(new_browser)()
    response = await _post(_client(other.session_key), row.pk, {"view": "waterfall"})
    assert response.status_code == 404  # another session's generation
    response = await _post(_client(session.session_key), row.pk, {"view": "waterfall", "top_n": 0})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_field")
    theirs = await sync_to_async(finished)(other.owner)
    response = await _post(_client(session.session_key), row.pk, {"view": "ab", "other_generation_id": theirs.pk})
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")  # side B is theirs
    response = await _post(_client(session.session_key), row.pk, {"view": "ab", "other_generation_id": row.pk})
    assert response.status_code == 200 and response.json()["first_flip"] is None


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_no_worker_is_a_timeout_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    from asgiref.sync import sync_to_async

    monkeypatch.setattr(inspect_api, "send_task", lambda *args: None)
    monkeypatch.setattr(inspection, "WAIT_S", 0.3)
    session = await sync_to_async(new_browser)()
    row = await sync_to_async(finished)(session.owner)
    response = await _post(_client(session.session_key), row.pk, {"view": "kv"})
    assert (response.status_code, response.json()["error"]["code"]) == (504, "inspection_timeout")
