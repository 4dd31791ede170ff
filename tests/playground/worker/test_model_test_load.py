"""Models an admin brings: sources checked on the web host (relative paths under
PLAYGROUND_DATA_DIR), the stop-id override, and the "test load" action whose worker body loads
a real tiny model and stores the report (or the exact error) on the record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models.tiny import make_tiny_model, make_tiny_tokenizer
from playground.models import LanguageModel, LoadReportStatus, resolve_source
from playground.worker.load_report import RAW_PROMPT, run_test_load
from tests.inference.tiny_gguf import CHATML, write_tiny_gguf
from tests.playground.sent_tasks import on_task

pytestmark = pytest.mark.django_db
ADD_URL = "/admin/playground/languagemodel/add/"


@pytest.fixture
def data_dir(settings: Any, tmp_path: Path) -> Path:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    settings.PLAYGROUND_DEVICE = "cpu"
    return tmp_path


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    return client


def save_tiny_folder(folder: Path, template: str | None = CHATML) -> None:
    make_tiny_model("llama").save_pretrained(folder)
    make_tiny_tokenizer(
        ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"), eos_token="<|eos|>", chat_template=template
    ).save_pretrained(folder)


def add_model(client: Client, source: str, **changes: Any) -> Any:
    form = {"name": "mine", "source": source, "dtype": "auto", "device": "auto", "max_context": "", "is_enabled": "on"}
    form["default_chat_template"] = ""
    form["eos_token_ids"] = ""
    form.update(changes)
    return client.post(ADD_URL, form)


def source_errors(response: Any, field: str = "source") -> str:
    assert response.status_code == 200, "the form was accepted"
    return " ".join(response.context["adminform"].form.errors[field])


# --- what the web host checks ---------------------------------------------------------------


def test_relative_paths_resolve_against_the_data_dir(data_dir: Path) -> None:
    assert resolve_source("models/x.gguf") == str(data_dir / "models" / "x.gguf")
    assert resolve_source("./mine") == str(data_dir / "mine")
    assert resolve_source("org/name") == "org/name"  # a hub id
    (data_dir / "org" / "name").mkdir(parents=True)
    assert resolve_source("org/name") == str(data_dir / "org" / "name")  # unless it exists there
    assert resolve_source("/abs/path") == "/abs/path" and resolve_source("bundled") == "bundled"
    model = LanguageModel(name="m", source="./mine")
    assert model.to_engine_config().source == str(data_dir / "mine")


def test_missing_and_incomplete_sources_are_refused(staff_client: Client, data_dir: Path) -> None:
    assert f"model folder {data_dir / 'absent'} does not exist" in source_errors(add_model(staff_client, "./absent"))
    assert "GGUF file" in source_errors(add_model(staff_client, "nope.gguf"))
    (data_dir / "weights").mkdir()
    (data_dir / "weights" / "config.json").write_text("{}")
    assert "has no tokenizer files" in source_errors(add_model(staff_client, "./weights"))
    write_tiny_gguf(data_dir / "cut.gguf")
    (data_dir / "cut.gguf").write_bytes((data_dir / "cut.gguf").read_bytes()[:-100])
    assert "the header says the tensors end at byte" in source_errors(add_model(staff_client, "cut.gguf"))
    assert not LanguageModel.objects.filter(name="mine").exists()


def test_good_sources_and_hub_ids_are_accepted(staff_client: Client, data_dir: Path) -> None:
    save_tiny_folder(data_dir / "tiny")
    assert add_model(staff_client, "./tiny", eos_token_ids="[259]").status_code == 302
    model = LanguageModel.objects.get(name="mine")
    assert model.source == "./tiny" and model.to_engine_config().eos_token_ids == (259,)
    assert add_model(staff_client, "some-org/some-model", name="hub").status_code == 302  # checked by a test load


def test_bad_stop_ids_are_refused(staff_client: Client, data_dir: Path) -> None:
    save_tiny_folder(data_dir / "tiny")
    assert "must be a list" in source_errors(add_model(staff_client, "./tiny", eos_token_ids="7"), "eos_token_ids")
    errors = source_errors(add_model(staff_client, "./tiny", eos_token_ids="[-1]"), "eos_token_ids")
    assert "eos_token_ids=(-1,)" in errors


# --- the action and the worker body -----------------------------------------------------------


def test_the_action_queues_a_test_load_on_the_shared_queue(
    staff_client: Client, data_dir: Path, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks
) -> None:
    model = LanguageModel.objects.create(name="mine", source="bundled", test_load_error="old")
    sent: list[tuple[Any, dict]] = []
    on_task(monkeypatch, "run_test_load", apply_async=lambda args, **kw: sent.append((args, kw)))
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(
            "/admin/playground/languagemodel/", {"action": "test_load", "_selected_action": [model.pk]}, follow=True
        )
    assert "Test load queued for 1 model(s) on queue &#x27;gpu&#x27;" in response.content.decode()
    assert sent == [((model.pk,), {"queue": "gpu"})]
    model.refresh_from_db()
    assert model.test_load_status == LoadReportStatus.QUEUED and model.test_load_error == ""


def test_a_test_load_reports_the_model_and_a_greedy_answer(staff_client: Client, data_dir: Path) -> None:
    save_tiny_folder(data_dir / "tiny")
    model = LanguageModel.objects.create(name="mine", source="./tiny", dtype="float32")
    run_test_load(model.pk, worker="w1")
    model.refresh_from_db()
    result = model.test_load_result
    assert model.test_load_status == LoadReportStatus.OK, model.test_load_error
    assert result["worker"] == "w1" and result["source"] == str(data_dir / "tiny")
    assert result["dtype"] == "float32" and result["device"] == "cpu" and result["runner"]
    assert result["num_params"] == sum(p.numel() for p in make_tiny_model("llama").parameters())
    assert result["load_s"] > 0 and result["rss_mb"] > 0
    assert result["eos_token_ids"] == [257, 259] and result["eos_tokens"] == ["<|eos|>", "<|im_end|>"]
    assert result["prompt"].startswith("<|im_start|>user\nWhat is the capital") and "\n" not in result["answer"]
    assert any("tokenizer" in line for line in result["progress"])
    page = staff_client.get(f"/admin/playground/languagemodel/{model.pk}/change/").content.decode()
    assert "257 &#x27;&lt;|eos|&gt;&#x27;, 259 &#x27;&lt;|im_end|&gt;&#x27;" in page and "w1" in page


def test_a_base_gguf_is_test_loaded_with_a_raw_prompt(data_dir: Path) -> None:
    write_tiny_gguf(data_dir / "base.gguf")
    model = LanguageModel.objects.create(name="base", source="base.gguf")
    run_test_load(model.pk, worker="w1")
    model.refresh_from_db()
    assert model.test_load_status == LoadReportStatus.OK, model.test_load_error
    assert model.test_load_result["prompt"] == RAW_PROMPT and not model.test_load_result["has_chat_template"]
    assert any("100% tensor" in line for line in model.test_load_result["progress"])  # the conversion bar


def test_a_failed_test_load_stores_the_exact_error(staff_client: Client, data_dir: Path) -> None:
    (data_dir / "weights").mkdir()
    model = LanguageModel.objects.create(name="broken", source=str(data_dir / "weights"))  # no clean(): bypassed
    run_test_load(model.pk, worker="w1")
    model.refresh_from_db()
    assert model.test_load_status == LoadReportStatus.ERROR
    assert (
        model.test_load_error
        == f"ModelLoadError: {data_dir / 'weights'} has no config.json, so it is not a Hugging Face model folder"
    )
    page = staff_client.get(f"/admin/playground/languagemodel/{model.pk}/change/").content.decode()
    assert "Failed:" in page and "has no config.json" in page
