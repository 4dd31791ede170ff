"""Hugging Face folders that would load badly: no tokenizer files, a tokenizer far smaller than
the vocabulary, an end-of-turn token missing from the stop ids, and the admin's override."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference.config import EngineConfig
from inference.models.loader import ModelLoadError, end_of_turn_id, load_model
from inference.models.tiny import make_tiny_model, make_tiny_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def save_folder(folder: Path, tokens: tuple[str, ...], template: str | None) -> None:
    model = make_tiny_model("llama")
    model.generation_config.eos_token_id = 257  # only "<|eos|>": the turn marker is missing
    model.save_pretrained(folder)
    make_tiny_tokenizer(tokens, eos_token="<|eos|>", chat_template=template).save_pretrained(folder)


def cpu(folder: Path, **kwargs) -> EngineConfig:
    return EngineConfig(source=str(folder), device="cpu", **kwargs)


@pytest.fixture(scope="module")
def chatml_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chatml")
    save_folder(folder, ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"), CHATML)
    return folder


def test_a_folder_without_tokenizer_files_is_refused(chatml_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(chatml_folder / name, folder)
    with pytest.raises(ModelLoadError) as caught:
        load_model(cpu(folder))
    message = str(caught.value)
    assert str(folder) in message and "has no tokenizer files" in message and "tokenizer.json" in message


def test_a_tokenizer_far_smaller_than_the_vocabulary_is_refused(chatml_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "big-vocab"
    shutil.copytree(chatml_folder, folder)
    config = (folder / "config.json").read_text().replace('"vocab_size": 320', '"vocab_size": 5000')
    (folder / "config.json").write_text(config)
    model = make_tiny_model("llama")
    model.resize_token_embeddings(5000)
    model.save_pretrained(folder)
    with pytest.raises(ModelLoadError, match="has 260 tokens but config.json says vocab_size=5,000"):
        load_model(cpu(folder))


def test_the_templates_end_of_turn_token_joins_the_stop_ids(chatml_folder: Path) -> None:
    loaded = load_model(cpu(chatml_folder))
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert loaded.model.generation_config.eos_token_id == 257
    assert loaded.eos_token_ids == (257, im_end)


@pytest.mark.parametrize(
    "tokens, template, expected",
    [
        (("<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"), GEMMA, "<end_of_turn>"),
        (("<|bos|>", "<|eos|>"), "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}", None),  # plain text
        (("<|bos|>", "<|eos|>"), "{{ raise_exception('no assistant turns') }}", None),  # a template that refuses
    ],
)
def test_end_of_turn_detection(tokens: tuple[str, ...], template: str, expected: str | None) -> None:
    tokenizer = make_tiny_tokenizer(tokens, chat_template=template)
    found = end_of_turn_id(tokenizer, template)
    assert found == (tokenizer.convert_tokens_to_ids(expected) if expected else None)


def test_stop_ids_can_be_overridden(chatml_folder: Path) -> None:
    assert load_model(cpu(chatml_folder, eos_token_ids=(258, 258, 42))).eos_token_ids == (258, 42)
    with pytest.raises(ModelLoadError, match=r"eos_token_ids \[9999\] are outside the vocabulary"):
        load_model(cpu(chatml_folder, eos_token_ids=(1, 9999)))
    with pytest.raises(ValueError, match="eos_token_ids"):
        cpu(chatml_folder, eos_token_ids=())
