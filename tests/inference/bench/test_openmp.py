"""The benchmarks run their engine on the main thread with torch's OpenMP workers asleep between
ops (the CPU kernels' own thread pool needs the cores they would spin on); the product (the
worker, its engine on a thread of its own) and the processes a benchmark starts keep OpenMP's
default, and a setting the user chose is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parents[3]
# libgomp prints its settings when OMP_DISPLAY_ENV=VERBOSE: workers asleep at once show a spin
# count of 0 (its default: 300000; OMP_WAIT_POLICY reads PASSIVE either way).
PROBE = """
import sys
{before}
import torch
torch.ones(256, 256) @ torch.ones(256, 256)
"""


def spin_count(before: str, env_policy: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_DISPLAY_ENV": "VERBOSE"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    code = PROBE.format(before=before)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lines = [line for line in result.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not lines:
        pytest.skip("this torch's OpenMP runtime does not display its settings")
    return int(lines[0].split("=")[1].strip().strip("'"))


def test_a_benchmark_makes_torchs_openmp_workers_sleep_between_ops() -> None:
    assert spin_count("from inference.bench.__main__ import quiet_openmp_workers; quiet_openmp_workers()") == 0


def test_the_engine_alone_keeps_openmps_default() -> None:
    assert spin_count("import inference.engine") > 0


def test_a_setting_the_user_chose_is_kept_and_started_processes_get_it_as_it_was() -> None:
    before = (
        "from inference.bench import starting_env\n"
        "from inference.bench.__main__ import quiet_openmp_workers\n"
        "quiet_openmp_workers()\n"
        "assert starting_env()['OMP_WAIT_POLICY'] == 'ACTIVE'"
    )
    assert spin_count(before, env_policy="ACTIVE") > 10**6


def test_processes_a_benchmark_starts_get_the_environment_it_started_with() -> None:
    before = (
        "from inference.bench import starting_env\n"
        "from inference.bench.__main__ import quiet_openmp_workers\n"
        "import os\n"
        "quiet_openmp_workers()\n"
        "assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE' and 'OMP_WAIT_POLICY' not in starting_env()"
    )
    assert spin_count(before) == 0
