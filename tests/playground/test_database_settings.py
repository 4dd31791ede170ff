"""The database settings each `DATABASE_URL` gets (read in a fresh process: settings load once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]


def database_settings(url: str, tmp_path: Path) -> dict:
    env = dict(os.environ, DATABASE_URL=url, PLAYGROUND_DATA_DIR=str(tmp_path), SECRET_KEY="x")
    code = "import json; from django.conf import settings; print(json.dumps(settings.DATABASES['default']))"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=REPO_DIR,
        env=env | {"DJANGO_SETTINGS_MODULE": "playground.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_postgresql_on_another_host_gives_up_on_a_silent_peer_within_seconds(tmp_path: Path) -> None:
    db = database_settings("postgres://u:p@10.0.0.5:5432/playground", tmp_path)
    assert db["ENGINE"] == "django.db.backends.postgresql" and db["HOST"] == "10.0.0.5"
    options = db["OPTIONS"]
    assert options["connect_timeout"] == 10 and options["tcp_user_timeout"] == 30_000
    assert options["keepalives"] == 1
    assert options["keepalives_idle"] + options["keepalives_interval"] * options["keepalives_count"] <= 30


def test_sqlite_keeps_its_own_options(tmp_path: Path) -> None:
    db = database_settings(f"sqlite:///{tmp_path / 'db.sqlite3'}", tmp_path)
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE" and "connect_timeout" not in db["OPTIONS"]
