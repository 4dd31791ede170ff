"""`manage.py create_api_key NAME [--max-concurrent N]`: a key of the OpenAI-compatible API from
the command line (a deployment script, another host, a benchmark), as the admin's "add API key"
makes one. Prints the key once, on its own line: only its hash is stored.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from playground.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for /v1/ and print it (once: only its hash is kept)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="who or what uses the key")
        parser.add_argument("--max-concurrent", type=int, help="its generations at once (default: the server's)")

    def handle(self, *args: Any, **options: Any) -> None:
        name, max_concurrent = options["name"].strip(), options["max_concurrent"]
        if not name or len(name) > ApiKey._meta.get_field("name").max_length:
            raise CommandError("the name must have 1 to 100 characters")
        if max_concurrent is not None and max_concurrent < 1:
            raise CommandError(f"--max-concurrent={max_concurrent} must be at least 1")
        key = ApiKey(name=name, max_concurrent=max_concurrent)
        secret = key.set_new_key()
        key.save()
        self.stdout.write(secret)
