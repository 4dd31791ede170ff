"""The web process never imports torch: the worker loads the engine lazily."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import django
django.setup()
import playground.admin, playground.api, playground.asgi, playground.consumers, playground.runner, playground.tasks
heavy = sorted(name for name in ("torch", "transformers", "inference.engine") if name in sys.modules)
print(",".join(heavy))
"""


def test_the_web_process_modules_do_not_import_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_DIR, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "DJANGO_SETTINGS_MODULE": "playground.settings"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
