"""torch's OpenMP workers sleep between ops in any process that imports the engine first (the
CPU kernels' own thread pool needs the cores they would spin on), unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parents[2]
# libgomp prints the settings it starts with when OMP_DISPLAY_ENV is set.
PROBE = "import inference, torch; torch.ones(256, 256) @ torch.ones(256, 256)"


def openmp_wait_policy(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_DISPLAY_ENV": "TRUE"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lines = [line for line in result.stderr.splitlines() if "OMP_WAIT_POLICY" in line]
    if not lines:
        pytest.skip("this torch's OpenMP runtime does not display its settings")
    return lines[0].split("=")[1].strip().strip("'")


def test_the_engine_makes_torchs_openmp_workers_sleep_between_ops() -> None:
    assert openmp_wait_policy(None) == "PASSIVE"


def test_a_wait_policy_the_user_set_is_kept() -> None:
    assert openmp_wait_policy("ACTIVE") == "ACTIVE"
