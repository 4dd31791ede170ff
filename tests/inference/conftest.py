"""Shared engine-test fixtures: the data dir and one session-wide load of the bundled model.

The converted bundled model lives in `PLAYGROUND_DATA_DIR` (or `<repo>/data`), so the
one-minute GGUF conversion happens once per machine, not once per test run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference.config import EngineConfig
from inference.models.bundled import ensure_bundled_model
from inference.models.loader import LoadedModel, load_model

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("PLAYGROUND_DATA_DIR") or REPO_ROOT / "data").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def bundled_model_dir(data_dir: Path) -> Path:
    return ensure_bundled_model(data_dir, progress=print)


@pytest.fixture(scope="session")
def bundled(bundled_model_dir: Path, data_dir: Path) -> LoadedModel:
    """The bundled SmolLM2-135M-Instruct on CPU in float32, loaded once per session."""
    return load_model(EngineConfig(source="bundled", device="cpu", dtype="float32", data_dir=str(data_dir)))
