"""Checks of a local model source that any host can run, without torch or transformers.

Owns: the tokenizer file names a Hugging Face folder must hold, and `check_local_source`:
a missing file or folder, a folder without config.json or tokenizer files, a `.gguf` file
whose header is damaged or cut short; and `has_random_weights`: a folder the demo builders
marked as holding random weights. The web process runs it on an admin's source (it sees
the same paths as the workers, or it refuses); the loader runs the folder checks again on the
worker. Must not know: loading, conversion, Django.
"""

from __future__ import annotations

import json
from pathlib import Path

from inference.gguf_file import GgufError, read_header

# any one of these is a tokenizer transformers can build without running the model's own code
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.tiktoken")

# The demo builders (inference/models/demo.py, vl_demo.py) write this into their folders.
RANDOM_WEIGHTS_MARKER = "demo.json"


class SourceError(ValueError):
    """The source cannot be a model: the message names the path and what is missing or wrong."""


def check_tokenizer_files(folder: Path) -> None:
    """transformers silently builds an empty tokenizer from config.json alone; refuse instead."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise SourceError(
            f"{folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy them from the "
            "model's original repository into the folder"
        )


def check_local_source(path: Path, trust_remote_code: bool = False) -> None:
    """`path` (absolute) is an existing .gguf file with a sound header, or a folder with
    config.json and tokenizer files; else `SourceError` saying what is wrong."""
    if path.name.lower().endswith(".gguf"):
        if not path.is_file():
            raise SourceError(f"GGUF file {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
        try:
            read_header(path)
        except GgufError as error:
            raise SourceError(str(error)) from error
        return
    if not path.exists():
        raise SourceError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise SourceError(f"{path} is a file, not a model folder or a .gguf file")
    if not (path / "config.json").is_file():
        raise SourceError(f"{path} has no config.json, so it is not a Hugging Face model folder")
    if not trust_remote_code:  # custom tokenizer code may keep its vocabulary anywhere
        check_tokenizer_files(path)


def has_random_weights(path: Path) -> bool:
    """Whether the folder at `path` is a demo whose `demo.json` says its weights are random: a
    real architecture whose text is noise. False for anything else (no folder, no marker)."""
    try:
        marker = json.loads((path / RANDOM_WEIGHTS_MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(marker, dict) and marker.get("random_weights") is True
