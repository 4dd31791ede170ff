"""`GET /v1/models`: a client that takes the first model gets the default one, a real model; the
random-weights demos come last and say what they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from inference.sources import RANDOM_WEIGHTS_MARKER
from playground.model_choice import default_model
from playground.models import LanguageModel

pytestmark = pytest.mark.django_db

# As `manage.py demo_model` and `demo_vl_model` name them (inference/models/demo.py, vl_demo.py).
DEMO_MODEL_NAME = "DeepSeek-V3 architecture demo (random weights)"
VL_DEMO_MODEL_NAME = "DeepSeek-VL architecture demo (random weights)"


def register_demo(folder: Path, name: str) -> None:
    """A demo as `manage.py demo_model` registers it: a folder whose marker says "random weights"."""
    folder.mkdir()
    (folder / RANDOM_WEIGHTS_MARKER).write_text(json.dumps({"format": 1, "random_weights": True, "name": name}))
    LanguageModel.objects.create(name=name, source=str(folder))


def test_the_first_model_is_the_default_and_the_demos_come_last(tmp_path: Path) -> None:
    # Their names sort first ("DeepSeek-..." < "Qwen..." < "SmolLM2..."): a client taking the first got noise.
    register_demo(tmp_path / "v3", DEMO_MODEL_NAME)
    register_demo(tmp_path / "vl", VL_DEMO_MODEL_NAME)
    real = tmp_path / "real"
    real.mkdir()  # a folder without the marker: a real model, listed after the default
    LanguageModel.objects.create(name="A real model", source=str(real))
    response = Client().get("/v1/models")
    assert response.status_code == 200
    models = response.json()["data"]
    assert models[0]["id"] == default_model().model.name
    assert [m["id"] for m in models[-2:]] == [DEMO_MODEL_NAME, VL_DEMO_MODEL_NAME]
    assert [(m["random_weights"], m["owned_by"]) for m in models[-2:]] == [(True, "playground-demo")] * 2
    real_ones = models[:-2]
    assert all(m["random_weights"] is False and m["owned_by"] == "playground" for m in real_ones)
    assert "A real model" in [m["id"] for m in real_ones[1:]]  # after the default, by name
    assert [m["id"] for m in real_ones[1:]] == sorted(m["id"] for m in real_ones[1:])
