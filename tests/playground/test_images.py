"""Images through the web side and the worker: checked on arrival with stable codes (nothing is
written for a bad one), stored with the message, and, on the random-weights DeepSeek-VL demo,
expanded into a block of image tokens whose numbers the token view shows."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from PIL import Image

from inference import EngineConfig
from inference.engine import Engine
from inference.models import vl_demo
from inference.models.loader import load_model
from playground.models import Generation, LanguageModel, Message
from playground.protocol import CommandError
from playground.web import submit
from playground.worker import generation

from .fake_engine import FakeEngine

pytestmark = pytest.mark.django_db
REPO_DIR = Path(__file__).resolve().parents[2]


def png_b64(colour: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (40, 30)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def vl_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    data_dir = Path(os.environ.get("PLAYGROUND_DATA_DIR") or REPO_DIR / "data").resolve()
    folder = vl_demo.ensure_vl_demo_model(data_dir, out_dir=tmp_path_factory.mktemp("vl") / "demo")
    loaded = load_model(EngineConfig(source=str(folder), device="cpu", dtype="float32", data_dir=str(data_dir)))
    return Engine(loaded, EngineConfig(source=str(folder)))


def model_folder(tmp_path: Path, name: str, config: dict[str, Any]) -> LanguageModel:
    """A registered model whose config.json (all the web side reads) is `config`."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return LanguageModel.objects.create(name=name, source=str(folder))


@pytest.fixture
def vl_model(tmp_path: Path) -> LanguageModel:
    config = {"vision_config": {"image_size": 384}, "image_token_id": 7}
    return model_folder(tmp_path, "a vision-language model", config)


@pytest.fixture
def text_model(tmp_path: Path) -> LanguageModel:
    return model_folder(tmp_path, "a text model", {"model_type": "llama", "hidden_size": 64})


def run(generation_id: int, engine: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    generation.run_generation(generation_id, "worker-1", load_engine=lambda model: engine, send=events.append)
    return events


@pytest.mark.parametrize(
    ("images", "code"),
    [
        ([{"data": "not base64!"}], "invalid_image"),
        ([{"data": base64.b64encode(b"plain text").decode()}], "invalid_image"),
        (["a string"], "invalid_image"),
        ([{"data": png_b64()}] * 5, "too_many_images"),
        ([{"data": png_b64(size=(300, 300))}], "image_too_many_pixels"),
    ],
)
def test_bad_images_are_refused_before_anything_is_written(owner: str, settings: Any, images: list, code: str) -> None:
    settings.PLAYGROUND_MAX_IMAGE_PIXELS = 200 * 200
    with pytest.raises(CommandError) as caught:
        submit.generate(owner, {"content": "What is this?", "images": images})
    assert caught.value.code == code
    assert not Message.objects.exists() and not Generation.objects.exists()


def test_a_too_large_image_is_refused(owner: str, settings: Any) -> None:
    settings.PLAYGROUND_MAX_IMAGE_BYTES = 100
    with pytest.raises(CommandError) as caught:
        submit.complete(owner, {"text": "x", "images": [{"data": "data:image/png;base64," + png_b64()}]})
    assert caught.value.code == "image_too_large"


def test_images_are_stored_with_the_message_and_kept_by_an_edit(owner: str, vl_model: LanguageModel) -> None:
    queued = submit.generate(
        owner, {"content": "What is this?", "images": [{"data": png_b64()}], "model_id": vl_model.pk}
    )
    stored = Message.objects.get(pk=queued.user_message_id).images
    assert [(i["media_type"], i["width"], i["height"]) for i in stored] == [("image/png", 40, 30)]
    assert base64.b64decode(stored[0]["data"]) == base64.b64decode(png_b64()) and len(stored[0]["content_hash"]) == 64
    Generation.objects.update(status=Generation.Status.FINISHED)
    edited = submit.edit(owner, {"message_id": queued.user_message_id, "content": "And now?"})
    assert Message.objects.get(pk=edited.user_message_id).images == stored


def test_a_text_model_is_refused_images_before_anything_is_written(
    owner: str, text_model: LanguageModel, vl_model: LanguageModel
) -> None:
    image = [{"data": png_b64()}]
    for command, content in (
        (submit.generate, {"content": "What is this?", "images": image}),
        (submit.complete, {"text": "Describe:", "images": image}),
    ):
        with pytest.raises(CommandError) as caught:
            command(owner, {**content, "model_id": text_model.pk})
        assert caught.value.code == "images_not_supported" and "a text model" in caught.value.message
    assert not Message.objects.exists() and not Generation.objects.exists()
    # A conversation with an image cannot go on, or be answered again, with the text model.
    queued = submit.generate(owner, {"content": "What is this?", "images": image, "model_id": vl_model.pk})
    Generation.objects.update(status=Generation.Status.FINISHED)
    num_rows = (Message.objects.count(), Generation.objects.count())
    for command, content in (
        (submit.generate, {"content": "And now?", "conversation_id": queued.conversation_id}),
        (submit.regenerate, {"message_id": queued.message_id}),
        (submit.edit, {"message_id": queued.user_message_id, "content": "Again?"}),
    ):
        with pytest.raises(CommandError) as caught:
            command(owner, {**content, "model_id": text_model.pk})
        assert caught.value.code == "images_not_supported"
    assert (Message.objects.count(), Generation.objects.count()) == num_rows
    # Without images the text model is fine; /api/models/ says which model takes them.
    submit.generate(owner, {"content": "Hi", "model_id": text_model.pk})
    listed = {m["name"]: m["accepts_images"] for m in Client().get("/api/models/").json()}
    assert (listed["a text model"], listed["a vision-language model"]) == (False, True)


def test_a_model_whose_config_the_web_host_cannot_read_is_left_to_the_worker(owner: str) -> None:
    model = LanguageModel.objects.create(name="elsewhere", source="/nowhere/on/this/host")
    queued = submit.generate(owner, {"content": "What is this?", "images": [{"data": png_b64()}], "model_id": model.pk})
    events = run(queued.generation_id, FakeEngine("ok"))
    assert events[-1]["type"] == "generation.error" and events[-1]["code"] == "images_not_supported"


def test_the_demo_vl_model_answers_and_the_prompt_shows_the_image_block(
    owner: str, vl_engine: Engine, vl_model: LanguageModel
) -> None:
    images = [{"data": png_b64()}, {"data": png_b64((10, 10, 240))}]
    queued = submit.generate(
        owner,
        {"content": "Compare them.", "images": images, "overrides": {"max_new_tokens": 3}, "model_id": vl_model.pk},
    )
    events = run(queued.generation_id, vl_engine)
    started, finished = events[0], events[-1]
    assert finished["type"] == "generation.finished", finished
    prompt, vision = started["prompt"], started["model"]["vision"]
    blocks = prompt["images"]
    assert [b["num_tokens"] for b in blocks] == [vision["tokens_per_image"]] * 2 == [64, 64]
    assert blocks[1]["start"] == blocks[0]["start"] + 64 and blocks[0]["grid"] == [8, 8]
    ids = [t["id"] for t in prompt["tokens"]]
    assert ids[blocks[0]["start"] : blocks[1]["start"] + 64] == [vision["image_token_id"]] * 128
    assert ids.count(vision["image_token_id"]) == 128
    assert blocks[0]["kv_bytes"] == 64 * started["model"]["kv_bytes_per_token"]
    assert blocks[0]["content_hash"] != blocks[1]["content_hash"]
    assert finished["stats"]["num_prompt_tokens"] == len(ids)


def test_an_images_kv_goes_from_a_prefill_worker_to_a_decode_worker(
    owner: str, vl_engine: Engine, vl_model: LanguageModel
) -> None:
    from tests.playground.worker.test_pd import GREEDY, run_decode, run_prefill

    engines = {role: Engine(vl_engine.loaded, vl_engine.config) for role in ("prefill", "decode")}
    command = {"text": "Describe it:", "images": [{"data": png_b64()}], "overrides": GREEDY, "model_id": vl_model.pk}
    colocated = run(submit.complete(owner, command).generation_id, Engine(vl_engine.loaded, vl_engine.config))
    queued = submit.complete(owner, command)
    events: list[dict[str, Any]] = []
    (task,) = run_prefill(queued.generation_id, engines, events)
    run_decode(task, engines, events)
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert events[0]["prompt"]["images"][0]["num_tokens"] == 64
    assert any(event["type"] == "generation.handoff" for event in events)
    assert events[-1]["text"] == colocated[-1]["text"] and colocated[-1]["stats"]["num_generated_tokens"] == 12
