"""The step export (`/api/generations/<id>/steps.json|.csv`): the stored records, unchanged,
for the owner of a finished generation only."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.test import Client

from playground.models import Generation
from tests.playground.conftest import make_generation
from tests.playground.web.test_api import owner_of

pytestmark = pytest.mark.django_db


def step(index: int, piece: str, token_bytes: str, raw_logprob: float) -> dict[str, Any]:
    alternatives = [
        {"token_id": 7, "piece": piece, "prob": 0.5, "logprob": -0.693},
        {"token_id": 9, "piece": ",", "prob": 0.25, "logprob": -1.386},
    ]
    return {
        "index": index, "phase": "prefill" if index == 0 else "decode", "token_id": 7, "piece": piece,
        "token_bytes": token_bytes, "text_delta": piece, "logprob": -0.5, "raw_logprob": raw_logprob, "rank": 1,
        "entropy": 1.25, "latency_ms": 3.5, "top_raw": alternatives, "top_processed": alternatives[:1],
        "kv_cache_bytes": 9216 * (index + 1), "type": "step",
    }  # fmt: skip


# A comma, a quote, a newline and a partial UTF-8 piece: what CSV quoting must carry through.
STEPS = [step(0, 'say "hi", then', "2c", -0.105), step(1, "\n", "0a", -2.3), step(2, "\ufffd", "e280", -7.0)]


@pytest.fixture
def browser() -> Client:
    client = Client()
    client.get("/")
    return client


def finished(client: Client, steps: list[dict[str, Any]] = STEPS) -> Generation:
    return make_generation(owner_of(client), status=Generation.Status.FINISHED, steps=steps, finish_reason="length")


def test_json_is_the_stored_records(browser: Client) -> None:
    row = finished(browser)
    response = browser.get(f"/api/generations/{row.pk}/steps.json")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="generation-{row.pk}-steps.json"'
    body = response.json()
    assert (body["generation_id"], body["finish_reason"], body["params"]) == (row.pk, "length", row.params)
    assert body["steps"] == STEPS


def test_csv_has_a_header_and_one_row_per_step_that_reads_back_to_the_records(browser: Client) -> None:
    row = finished(browser)
    response = browser.get(f"/api/generations/{row.pk}/steps.csv")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert list(rows[0]) == list(STEPS[0])  # the header: the record's keys in order
    assert len(rows) == len(STEPS)
    for got, want in zip(rows, STEPS):
        assert (got["piece"], got["token_bytes"], got["phase"]) == (want["piece"], want["token_bytes"], want["phase"])
        assert float(got["raw_logprob"]) == want["raw_logprob"] and float(got["entropy"]) == want["entropy"]
        assert int(got["kv_cache_bytes"]) == want["kv_cache_bytes"]
        assert json.loads(got["top_raw"]) == want["top_raw"]
        assert json.loads(got["top_processed"]) == want["top_processed"]


def test_beam_steps_export_with_their_own_columns(browser: Client) -> None:
    beams = [{"index": 0, "phase": "prefill", "beams": [{"token_ids": [5], "text": "a", "score": -0.1, "parent": 0}],
              "latency_ms": 2.0, "type": "beam_step"}]  # fmt: skip
    row = finished(browser, beams)
    rows = list(csv.DictReader(io.StringIO(browser.get(f"/api/generations/{row.pk}/steps.csv").content.decode())))
    assert list(rows[0]) == ["index", "phase", "beams", "latency_ms", "type"]
    assert json.loads(rows[0]["beams"]) == beams[0]["beams"]


def test_another_session_is_refused(browser: Client) -> None:
    row = finished(browser)
    stranger = Client()
    stranger.get("/")
    for fmt in ("json", "csv"):
        response = stranger.get(f"/api/generations/{row.pk}/steps.{fmt}")
        assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")


def test_a_running_generation_and_an_unknown_format_are_refused(browser: Client) -> None:
    running = make_generation(owner_of(browser), status=Generation.Status.RUNNING, steps=STEPS[:1])
    response = browser.get(f"/api/generations/{running.pk}/steps.json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_params")
    response = browser.get(f"/api/generations/{finished(browser).pk}/steps.xml")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_field")
    assert browser.post(f"/api/generations/{running.pk}/steps.csv").json()["error"]["code"] == "method_not_allowed"
