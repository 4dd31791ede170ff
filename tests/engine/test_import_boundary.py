"""The engine (`inference/`) must never import the web stack.

Two independent checks: each module imported alone in a fresh interpreter leaves none of the
forbidden packages in `sys.modules` (catches indirect imports), and a static scan of every
import statement and `import_module("...")` call (catches imports inside functions that
the first check never runs).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO_ROOT / "inference"
FORBIDDEN = ("django", "celery", "channels", "channels_redis", "daphne")


def engine_modules() -> list[str]:
    modules = []
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def is_forbidden(module: str) -> bool:
    return module.split(".")[0] in FORBIDDEN


def test_engine_modules_are_found() -> None:
    modules = engine_modules()
    assert "inference" in modules and "inference.text.tokenization" in modules


@pytest.mark.parametrize("module", engine_modules())
def test_importing_alone_pulls_in_no_web_stack(module: str) -> None:
    probe = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], f"{module} imports the web stack"


def imported_names(source: str) -> list[str]:
    """Every module an import statement or a literal `import_module`/`__import__` call names."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
        ):
            names.append(node.args[0].value)
    return names


def test_static_scan_finds_no_web_stack_imports() -> None:
    offenders = {
        str(path.relative_to(REPO_ROOT)): bad
        for path in sorted(ENGINE_DIR.rglob("*.py"))
        if (bad := [n for n in imported_names(path.read_text()) if is_forbidden(n)])
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        "import django",
        "import os, channels.layers",
        "from celery import shared_task",
        "def lazy():\n    from channels_redis.core import RedisChannelLayer",
        "import importlib\nimportlib.import_module('daphne.server')",
        "__import__('django.conf')",
    ],
)
def test_static_scan_catches_each_form(source: str) -> None:
    assert any(is_forbidden(n) for n in imported_names(source))


def test_static_scan_ignores_lookalikes() -> None:
    assert not any(is_forbidden(n) for n in imported_names("import djangoish\nfrom .channels import x\nimport torch"))
