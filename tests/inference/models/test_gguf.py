"""GGUF files the project has never seen: without a chat template, damaged, cut short, or
holding something that cannot be converted. Tiny GGUFs are written by `tiny_gguf` with the
`gguf` package; every error must say what is wrong before anything is dequantized."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import pytest
import torch

import inference.models.bundled as bundled_module
from inference.config import EngineConfig
from inference.engine import Engine
from inference.gguf_file import GgufError, read_header
from inference.models.bundled import ConversionError, convert_gguf, ensure_converted
from inference.models.loader import ModelLoadError, load_model
from inference.sampling_params import SamplingParams
from tests.inference.tiny_gguf import CHATML, truncate, write_tiny_gguf


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A base model: tokenizer, weights, no chat template."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-base.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture
def no_dequantizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if conversion gets as far as reading weights."""

    def refuse(*args, **kwargs):
        raise AssertionError("dequantized a file that should have been refused from its header")

    monkeypatch.setattr(bundled_module, "stream_safetensors", refuse)
    monkeypatch.setattr(bundled_module, "load_gguf", refuse)


def cpu(source: Path, data_dir: Path, **kwargs) -> EngineConfig:
    return EngineConfig(source=str(source), device="cpu", data_dir=str(data_dir), **{"dtype": "float32", **kwargs})


def test_header_is_read_without_the_weights(base_gguf) -> None:
    path, model = base_gguf
    header = read_header(path)
    assert header.architecture == "llama" and header.version == 3
    assert header.vocab_size == 320 and not header.has_chat_template
    assert len(header.tensors) == len(model.state_dict())
    assert header.parameter_count == sum(t.numel() for t in model.state_dict().values())
    assert header.data_end == header.file_size  # F32 tensors fill the file exactly


def test_a_base_model_without_template_converts_and_loads(base_gguf, tmp_path: Path) -> None:
    path, original = base_gguf
    messages: list[str] = []
    loaded = load_model(cpu(path, tmp_path), progress=messages.append)
    assert loaded.chat_template is None
    weights = loaded.model.state_dict()
    for name, tensor in original.state_dict().items():  # q/k un-permuted, nothing lost
        assert torch.equal(weights[name], tensor), name
    assert any("no chat template" in m for m in messages)
    bars = [m for m in messages if m.startswith("[") and "tensor " in m]
    assert bars and bars[-1].startswith("[" + "#" * 20 + "] 100% tensor 21/21")
    assert loaded.eos_token_ids == (257,)  # "<|eos|>"; no template, so no end-of-turn token


def test_raw_completion_works_and_chat_asks_for_a_template(base_gguf, tmp_path: Path) -> None:
    engine = Engine.load(cpu(base_gguf[0], tmp_path))
    events = list(engine.generate(engine.prompts.encode("Hello"), SamplingParams(greedy=True, max_new_tokens=3)))
    assert events[-1].num_generated_tokens == 3
    with pytest.raises(ValueError, match="has no chat template"):
        engine.prompts.render_chat([{"role": "user", "content": "Hi"}])
    assert engine.prompts.render_chat([{"role": "user", "content": "Hi"}], CHATML).text.startswith("<|im_start|>user")


def test_a_template_in_the_gguf_is_kept_and_ends_the_turn(tmp_path: Path) -> None:
    path = tmp_path / "tiny-chat.gguf"
    write_tiny_gguf(path, chat_template=CHATML)
    loaded = load_model(cpu(path, tmp_path))
    assert loaded.chat_template == CHATML
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert loaded.tokenizer.eos_token_id == 257 and im_end == 259
    assert loaded.eos_token_ids == (257, im_end)  # the end of turn joins the EOS id


# --- damaged files: what is wrong, before dequantizing ----------------------------------


def conversion_error(path: Path, tmp_path: Path) -> str:
    with pytest.raises(ConversionError) as caught:
        convert_gguf(path, tmp_path / "out")
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    return message


def test_truncated_tensor_data_says_where_the_file_should_end(base_gguf, tmp_path: Path, no_dequantizing) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(base_gguf[0].read_bytes())
    full = path.stat().st_size
    truncate(path, full - 1000)
    message = conversion_error(path, tmp_path)
    assert f"the tensors end at byte {full:,}" in message and f"the file has {full - 1000:,} bytes" in message
    assert "1,000 missing" in message


def test_a_header_cut_short_says_what_it_was_reading(base_gguf, tmp_path: Path, no_dequantizing) -> None:
    path = tmp_path / "stub.gguf"
    path.write_bytes(base_gguf[0].read_bytes()[:200])
    message = conversion_error(path, tmp_path)
    assert "the header ends at byte 200 while reading metadata" in message


def test_wrong_magic_and_empty_files(tmp_path: Path, no_dequantizing) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "it starts with b'PK\\x03\\x04', a GGUF file starts with b'GGUF'" in conversion_error(path, tmp_path)
    path.write_bytes(b"")
    assert "is empty (0 bytes)" in conversion_error(path, tmp_path)
    path.write_bytes(b"GGUF" + struct.pack("<I", 1) + bytes(16))
    assert "GGUF version 1" in conversion_error(path, tmp_path)


def write_bare_gguf(path: Path, arch: str, with_tokenizer: bool) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    if with_tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b"])
    writer.add_tensor("token_embd.weight", torch.zeros(2, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unconvertible_content_is_refused_from_the_header(tmp_path: Path, no_dequantizing) -> None:
    path = tmp_path / "odd.gguf"
    write_bare_gguf(path, "not-an-arch", with_tokenizer=True)
    assert "architecture 'not-an-arch' cannot be converted" in conversion_error(path, tmp_path)
    write_bare_gguf(path, "llama", with_tokenizer=False)
    assert "carries no tokenizer" in conversion_error(path, tmp_path)


def test_read_header_is_a_gguf_error_for_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key" + struct.pack("<I", 99))
    with pytest.raises(GgufError, match="unknown metadata value type 99"):
        read_header(path)


def test_load_errors_name_the_file_and_leave_no_lock_or_folder(base_gguf, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(base_gguf[0].read_bytes()[:-8])
    with pytest.raises(ModelLoadError, match="is truncated: the header says the tensors end at byte"):
        load_model(cpu(path, tmp_path / "data"))
    assert list((tmp_path / "data" / "models").iterdir()) == []  # no lock file, no staging folder


def test_lock_file_is_removed_after_success(base_gguf, tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    ensure_converted(base_gguf[0], target)
    assert [p.name for p in target.parent.iterdir()] == ["m"]
