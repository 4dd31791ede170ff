"""`manage.py demo_model`: build the random-weights DeepSeek-V3 demo model once and register it.

Owns: the demo model's `LanguageModel` record (never the default; its name says "random
weights"). The folder itself is built by `inference.models.demo` (imported here, in this
one-shot command, never by the web process). `make run` calls it after the migrations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from playground.models import LanguageModel


class Command(BaseCommand):
    help = "Build the DeepSeek-V3 architecture demo (random weights) under the data dir and register it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-register", action="store_true", help="only build the folder")
        parser.add_argument("--out-dir", help="build it here instead of under the data dir (tests: a temporary folder)")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference.models import demo

        data_dir = settings.PLAYGROUND_DATA_DIR
        folder = demo.ensure_demo_model(data_dir, progress=self.stdout.write, out_dir=options["out_dir"])
        if not options["no_register"]:
            self.stdout.write(register_demo(folder, demo.DEMO_MODEL_NAME))


def register_demo(folder: Path, name: str) -> str:
    """The demo's `LanguageModel`, by name (created once, never the default; a rebuild into
    another folder points it there); a line saying so."""
    data_dir = settings.PLAYGROUND_DATA_DIR
    folder = folder.resolve()
    source = str(folder.relative_to(data_dir) if folder.is_relative_to(data_dir) else folder)
    model, created = LanguageModel.objects.get_or_create(name=name, defaults={"source": source, "is_default": False})
    if not created and model.source != source:
        model.source = source
        model.save(update_fields=["source", "updated_at"])
        return f"re-pointed: {model.name} (id {model.pk}) now loads {source}"
    return f"{'registered' if created else 'already registered'}: {model.name} (id {model.pk})"
