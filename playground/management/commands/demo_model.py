"""`manage.py demo_model`: build the random-weights DeepSeek-V3 demo model once and register it.

Owns: the demo model's `LanguageModel` record (never the default; its name says "random
weights"). The folder itself is built by `inference.models.demo` (imported here, in this
one-shot command, never by the web process). `make run` calls it after the migrations.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from playground.models import LanguageModel


class Command(BaseCommand):
    help = "Build the DeepSeek-V3 architecture demo (random weights) under the data dir and register it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-register", action="store_true", help="only build the folder")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference.models import demo

        folder = demo.ensure_demo_model(settings.PLAYGROUND_DATA_DIR, progress=self.stdout.write)
        if options["no_register"]:
            return
        source = str(folder.relative_to(settings.PLAYGROUND_DATA_DIR))
        model, created = LanguageModel.objects.get_or_create(
            source=source, defaults={"name": demo.DEMO_MODEL_NAME, "is_default": False}
        )
        self.stdout.write(f"{'registered' if created else 'already registered'}: {model.name} (id {model.pk})")
