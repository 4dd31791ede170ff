"""The architecture card over HTTP: reference configs, registered models' config.json, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import inference.introspect.architecture as arch
from inference.bundled_models import BUNDLED_MODELS
from inference.models.bundled import bundled_model_dir
from playground.models import LanguageModel
from playground.web import architecture

pytestmark = pytest.mark.django_db

LLAMA = {
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}


def test_reference_card_is_the_real_v3() -> None:
    card = Client().get("/api/architectures/deepseek_v3_671b/?context=1000").json()
    assert card["key"] == "deepseek_v3_671b"
    assert card["kv_cache"]["bytes_per_token"] == 70_272
    assert card["kv_cache"]["bytes_at_context"] == 70_272_000
    assert 670e9 < card["parameters"]["total"] < 672e9


def test_list_names_models_and_references(bundled_model: LanguageModel) -> None:
    listing = Client().get("/api/architectures/").json()
    # is_default: the page opens on the model the chat uses (not the first name in the list)
    default = LanguageModel.default()
    assert default != bundled_model  # Qwen2.5-Coder since migration 0011, listed after SmolLM2
    assert {"id": default.pk, "name": default.name, "is_default": True} in listing["models"]
    assert {"id": bundled_model.pk, "name": bundled_model.name, "is_default": False} in listing["models"]
    assert "deepseek_v2_lite_16b" in [r["key"] for r in listing["references"]]


def test_bundled_model_card_reads_its_converted_folder(settings: Any, tmp_path: Path, bundled_model) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    bundled_model_dir(tmp_path).mkdir(parents=True)
    (bundled_model_dir(tmp_path) / "config.json").write_text(json.dumps(LLAMA))
    card = Client().get(f"/api/models/{bundled_model.pk}/architecture/?context=10").json()
    # 2 layers x (K and V) x 2 KV heads x 16 dims x 4 bytes
    assert card["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert card["kv_cache"]["form"] == "gqa"
    assert card["model_id"] == bundled_model.pk


def test_folder_model_and_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    model = LanguageModel.objects.create(name="folder", source=str(tmp_path))
    card = Client().get(f"/api/models/{model.pk}/architecture/?dtype=bfloat16").json()
    assert card["weights"]["dtype"] == "bfloat16"
    assert card["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2


def test_errors_say_what_is_wrong(tmp_path: Path) -> None:
    client = Client()
    bad = client.get("/api/architectures/deepseek_v3_671b/?context=many")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_field")
    assert client.get("/api/architectures/deepseek_v3_671b/?dtype=int3").json()["error"]["code"] == "invalid_field"
    assert client.get("/api/architectures/gpt5/").status_code == 404
    missing = LanguageModel.objects.create(name="missing", source=str(tmp_path / "nowhere"))
    error = client.get(f"/api/models/{missing.pk}/architecture/").json()["error"]
    assert error["code"] == "model_unavailable" and "no config.json" in error["message"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    bert = LanguageModel.objects.create(name="bert", source=str(tmp_path))
    assert "bert" in client.get(f"/api/models/{bert.pk}/architecture/").json()["error"]["message"]


def test_every_bundled_models_card_reads_the_folder_the_engine_converts_into(settings: Any, tmp_path: Path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    assert architecture.config_path("bundled") == bundled_model_dir(tmp_path) / "config.json"
    for model in BUNDLED_MODELS:
        assert architecture.config_path(model.source) == tmp_path / "models" / model.folder_name / "config.json"


def test_page_is_linked_from_the_topbar() -> None:
    page = Client().get("/architecture/")
    assert page.status_code == 200
    assert b'href="/architecture/" aria-current="page"' in page.content
    assert b"architecture_page.js" in page.content


def test_a_gguf_model_card_reads_the_files_header(tmp_path: Path) -> None:
    """A model registered from a .gguf file answered 400 "no config.json for ... (a .gguf file gets
    one once a worker has converted it)", so /learn/ and the card failed: the card now comes
    from the file's header, equal to the card of the model the file holds."""
    from tests.inference.tiny_gguf import CHATML, write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    model = write_tiny_gguf(path, chat_template=CHATML)
    row = LanguageModel.objects.create(name="tiny gguf", source=str(path))
    response = Client().get(f"/api/models/{row.pk}/architecture/?context=64")
    assert response.status_code == 200, response.content
    card = response.json()
    expected = arch.card(model.config.to_dict(), context=64, name=row.name)
    assert card["parameters"] == expected["parameters"]
    assert card["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    for part in ("shape", "kv_cache", "flops", "decode_bytes_read"):
        assert card[part] == expected[part], part
    assert card["model_id"] == row.pk and card["weights"]["dtype"] == "float32"  # what the conversion writes
    path.write_bytes(path.read_bytes()[:100])  # cut short: refused, saying so
    error = Client().get(f"/api/models/{row.pk}/architecture/").json()["error"]
    assert error["code"] == "model_unavailable" and "tiny gguf" in error["message"]
