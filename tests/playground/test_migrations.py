"""The migrations describe the models exactly: labels and help texts included, so a change to
the models (e.g. a translatable label) cannot ship without its migration."""

from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_lacks_a_migration() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)  # exits non-zero if one is missing
