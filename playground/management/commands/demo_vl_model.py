"""`manage.py demo_vl_model`: build the random-weights DeepSeek-VL demo model once and register it.

Owns: the demo's `LanguageModel` record (never the default; its name says "random weights").
The folder itself is built by `inference.models.vl_demo` (imported here, in this one-shot
command, never by the web process). Registration is `demo_model`'s (`register_demo`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from playground.management.commands.demo_model import register_demo


class Command(BaseCommand):
    help = "Build the DeepSeek-VL architecture demo (random weights) under the data dir and register it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-register", action="store_true", help="only build the folder")
        parser.add_argument("--out-dir", help="build it here instead of under the data dir (tests: a temporary folder)")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference.models import vl_demo

        folder = vl_demo.ensure_vl_demo_model(
            settings.PLAYGROUND_DATA_DIR, progress=self.stdout.write, out_dir=options["out_dir"]
        )
        if not options["no_register"]:
            self.stdout.write(register_demo(folder, vl_demo.VL_DEMO_MODEL_NAME))
