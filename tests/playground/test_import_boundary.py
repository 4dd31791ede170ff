"""Which process runs what, enforced: `playground/web/` (the ASGI process) never imports torch,
the engine's device code or the worker; `playground/worker/` never imports the web side;
`playground/coord/` (used by both) imports neither.

Three checks: the web process's modules imported in a fresh interpreter leave no heavy module
in `sys.modules` (catches indirect imports); a static scan of every import statement in each
package (catches imports inside functions that the first check never runs) against what the
package must never import; and, stricter, an allow-list of the project modules each package
may import at all (a new dependency across packages is a decision, made here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inference.test_import_boundary import imported_names

REPO_DIR = Path(__file__).resolve().parents[2]
APP_DIR = REPO_DIR / "playground"

# What each package must never import (a name or any submodule of it).
FORBIDDEN = {
    "web": ("torch", "transformers", "inference.engine", "inference.models", "inference.kv", "playground.worker"),
    "worker": ("playground.web",),
    "coord": ("torch", "transformers", "inference.engine", "inference.models", "playground.web", "playground.worker"),
}

# The project modules (and their submodules) each package may import; anything else of
# `playground` or `inference` is refused. The web side reads the engine's torch-free contracts only.
ENGINE_CONTRACTS = (
    "inference.config",
    "inference.sampling_params",
    "inference.sampling.grammar_spec",
    "inference.sources",
    "inference.gguf_file",  # a .gguf file's header, read without torch (the architecture card)
    "inference.text.chat_template",
    "inference.text.default_system_prompt",
    "inference.text.reasoning",
    "inference.vision.images",
    "inference.introspect.architecture",
    "inference.bundled_models",
)
SHARED = (
    "playground.protocol",
    "playground.encoded_json",
    "playground.models",
    "playground.limits",
    "playground.images",
    "playground.coord",
    "playground.choices",
    "playground.model_choice",
)
ALLOWED = {
    "web": (
        *SHARED,
        *ENGINE_CONTRACTS,
        "playground.web",
        "playground.dispatch",
        "playground.task_names",
        "playground.inspection",
    ),
    "worker": (*SHARED, "playground.worker", "playground.inspection", "inference"),
    "coord": ("playground.coord", "playground.models"),
}

PROBE = """
import sys
import django
django.setup()
import playground.admin, playground.asgi, playground.dispatch, playground.tasks, playground.urls
import playground.web.api, playground.web.consumers, playground.web.pages, playground.web.submit
heavy = sorted(name for name in sys.modules
               if name.split(".")[0] in ("torch", "transformers")
               or name.startswith(("inference.engine", "inference.models", "playground.worker")))
print(",".join(heavy))
"""


def is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_web_process_modules_do_not_import_torch_or_the_worker() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "playground.settings"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_static_scan_finds_no_import_across_the_boundary(package: str) -> None:
    files = sorted((APP_DIR / package).rglob("*.py"))
    assert files, f"playground/{package}/ is empty"
    offenders = {
        str(path.relative_to(REPO_DIR)): bad
        for path in files
        if (bad := [n for n in imported_names(path.read_text()) if is_under(n, FORBIDDEN[package])])
    }
    assert offenders == {}


def test_static_scan_sees_a_lazy_import_across_the_boundary() -> None:
    source = "def f():\n    from playground.worker import generation\n    import torch.nn"
    assert [n for n in imported_names(source) if is_under(n, FORBIDDEN["web"])] == ["playground.worker", "torch.nn"]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_allow_list_names(package: str) -> None:
    offenders = {
        str(path.relative_to(REPO_DIR)): bad
        for path in sorted((APP_DIR / package).rglob("*.py"))
        if (
            bad := [
                n
                for n in imported_names(path.read_text())
                if n.split(".")[0] in ("playground", "inference")
                and n != "playground"
                and not is_under(n, ALLOWED[package])
            ]
        )
    }
    assert offenders == {}


def test_the_allow_list_refuses_what_it_does_not_name() -> None:
    assert is_under("inference.engine_core", ALLOWED["worker"]) and not is_under("inference.engine", ALLOWED["web"])
    assert not is_under("playground.worker.generation", ALLOWED["web"]) and not is_under(
        "playground.web", ALLOWED["coord"]
    )
