"""The "precision" inspection: a finished generation's steps under the served weights and under
the same model in another precision, on a tiny real model (float32 served, int8 compared)."""

from __future__ import annotations

import pytest
import torch

from inference.introspect.ab import kl_divergence
from inference.introspect.recompute import recompute, replay
from playground import inspection
from playground.worker import inspections
from tests.inference.engines import engine_for
from tests.playground.worker.test_inspect import TINY, ask, finished

pytestmark = pytest.mark.django_db

INT8 = engine_for("llama", precision="int8")  # the same seed: TINY's weights, quantized


@pytest.fixture
def int8_beside(monkeypatch) -> None:
    monkeypatch.setattr(inspections, "comparison_model", lambda model, precision: INT8.loaded)


def test_each_step_under_both_precisions_with_the_kl_between_them(owner: str, int8_beside) -> None:
    row = finished(owner)
    answer = ask(row, view="precision", precision="int8", top_n=5)
    assert answer["ok"], answer
    result = answer["result"]
    assert (result["served_precision"], result["other_precision"]) == ("float32", "int8")
    path = [step["token_id"] for step in row.steps]
    assert [s["token_id"] for s in result["steps"]] == path
    context = [int(t["id"]) for t in row.prompt["tokens"]]
    other = recompute(INT8.model, context, path)
    for k, step in enumerate(result["steps"]):
        served_top = step["served"]["top"]
        # the served side is the generation's own raw distribution, as streamed (the served path)
        assert [a["token_id"] for a in served_top] == [a["token_id"] for a in row.steps[k]["top_raw"][:5]]
        assert served_top[0]["logprob"] == pytest.approx(row.steps[k]["top_raw"][0]["logprob"], abs=1e-6)
        other_logprobs = torch.log_softmax(other.logits(k).double(), dim=-1)
        assert step["other"]["top"][0]["logprob"] == pytest.approx(float(other_logprobs.max()), abs=1e-6)
        served_logprobs = torch.log_softmax(replay(TINY, context, path).logits(k).double(), dim=-1)
        assert step["kl"] == pytest.approx(kl_divergence(served_logprobs, other_logprobs), rel=1e-6)
        assert step["kl"] > 0  # int8 is not float32
        assert step["served"]["top"][0]["piece"] == TINY.prompts.piece(step["served"]["top"][0]["token_id"])
    assert result["mean_kl"] == pytest.approx(sum(s["kl"] for s in result["steps"]) / len(path))


def test_the_precision_must_be_named_and_known() -> None:
    with pytest.raises(inspection.CommandError, match="precision"):
        inspection.parse({"view": "precision"}, {})
    with pytest.raises(inspection.CommandError, match="precision='int3'"):
        inspection.parse({"view": "precision", "precision": "int3"}, {})
    assert inspection.parse({"view": "precision", "precision": "int4"}, {})["precision"] == "int4"
