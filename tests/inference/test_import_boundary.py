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
import re
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


# One interpreter imports every engine module; what one module imported alone pulls in is a
# subset of that, so when nothing forbidden arrived every module is clean (a few seconds, not a
# fresh interpreter per module). Only when something did, a child is forked per module (each
# imports its module alone, in a fresh copy of the interpreter that had imported nothing of ours)
# to name the culprits.
PROBE = """
import importlib, json, os, sys
import torch, transformers  # noqa: F401
forbidden = tuple(sys.argv[1].split(","))
modules = sys.argv[2:]

def forbidden_now():
    return sorted(m for m in sys.modules if m.split(".")[0] in forbidden)

pid = os.fork()
if pid == 0:  # everything at once
    for module in modules:
        importlib.import_module(module)
    os._exit(3 if forbidden_now() else 0)
_, status = os.waitpid(pid, 0)
if os.waitstatus_to_exitcode(status) == 0:
    for module in modules:
        print(json.dumps([module, []]), flush=True)
    sys.exit(0)
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            found = forbidden_now()
        except BaseException as exc:
            found = [f"import failed: {exc!r}"]
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        print(json.dumps([module, json.loads(pipe.read() or '["no answer"]')]), flush=True)
    os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def web_modules_pulled_in() -> dict[str, list[str]]:
    """For each engine module, the web-stack modules that importing it alone brings in."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(FORBIDDEN), *engine_modules()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))


@pytest.mark.parametrize("module", engine_modules())
def test_importing_alone_pulls_in_no_web_stack(module: str, web_modules_pulled_in: dict[str, list[str]]) -> None:
    assert web_modules_pulled_in[module] == [], f"{module} imports the web stack"


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


# ---- inside the engine: what each package may import of the engine (an allow-list) ------------

CONTRACTS = ("inference.config", "inference.sampling_params", "inference.events")
ALLOWED = {
    # tensor-free bookkeeping: unit-tested without a device
    "core": ("inference.core", "inference.sampling_params"),
    "vision": ("inference.vision",),
    "kernels": ("inference.kernels",),
    "text": (*CONTRACTS, "inference.text", "inference.vision"),
    "sampling": (*CONTRACTS, "inference.sampling", "inference.kernels", "inference.text"),
    "kv": (*CONTRACTS, "inference.kv", "inference.vision"),
    # what owns the device; the MoE routing capture is the introspection's, read per row
    "models": (
        *CONTRACTS,
        "inference.models",
        "inference.core",
        "inference.kernels",
        "inference.kv",
        "inference.text",
        "inference.gguf_file",
        "inference.sources",
        "inference.introspect.moe",
        "inference.bundled_models",
    ),
    # exact views of finished generations; the engine only as a type; a GGUF header for the card;
    # the passes through the served path: the runner and a scratch sequence's KV blocks (passes.py)
    "introspect": (
        *CONTRACTS,
        "inference.introspect",
        "inference.sampling",
        "inference.engine",
        "inference.gguf_file",
        "inference.core",
        "inference.models.runner",
    ),
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_engine_package_imports_only_its_allow_list(package: str) -> None:
    allowed = ALLOWED[package]
    offenders = {
        str(path.relative_to(REPO_ROOT)): bad
        for path in sorted((ENGINE_DIR / package).rglob("*.py"))
        if (
            bad := [
                n
                for n in imported_names(path.read_text())
                if n.startswith("inference.") and not any(n == a or n.startswith(a + ".") for a in allowed)
            ]
        )
    }
    assert offenders == {}


def test_no_engine_module_calls_another_modules_private_names() -> None:
    """`module._name(...)` across modules: each module keeps its underscore names to itself."""
    pattern = re.compile(r"\b(?!self\b|cls\b)([a-z_][a-z0-9_]*)\._[a-z][a-z0-9_]*\(")
    offenders = {}
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        calls = {m.group(0) for m in pattern.finditer(path.read_text()) if not m.group(1).startswith("_")}
        calls = {c for c in calls if not c.startswith(("torch.", "F.", "os.", "np."))}
        if calls:
            offenders[str(path.relative_to(REPO_ROOT))] = sorted(calls)
    assert offenders == {}
