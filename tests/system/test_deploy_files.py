"""docker-compose.yml cannot be run here (no Docker daemon), so check what it promises."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load((REPO_DIR / "docker-compose.yml").read_text())["services"]


def worker_queues(service: dict) -> str:
    command = service["command"]
    return command[command.index("-Q") + 1]


def test_every_role_has_a_service(services: dict) -> None:
    assert {"redis", "postgres", "web", "worker-gpu", "worker-cpu", "worker-prefill", "worker-decode"} <= set(services)
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    assert services["worker-prefill"]["profiles"] == services["worker-decode"]["profiles"] == ["pd"]


def test_workers_listen_on_their_queues_with_the_right_device(services: dict) -> None:
    assert worker_queues(services["worker-gpu"]) == "gpu,celery"
    assert worker_queues(services["worker-cpu"]) == "gpu,celery"
    assert worker_queues(services["worker-prefill"]) == "prefill"
    assert worker_queues(services["worker-decode"]) == "decode"
    assert services["worker-gpu"]["environment"]["PLAYGROUND_DEVICE"] == "cuda"
    assert services["worker-cpu"]["environment"]["PLAYGROUND_DEVICE"] == "cpu"
    devices = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in services["worker-cpu"]


def test_app_services_share_redis_postgres_and_a_secret_key_but_no_disk(services: dict) -> None:
    """The topology of `make multihost-check`: every app container has its own /data (the models
    prepared in the image), so nothing but Redis, PostgreSQL and the SECRET_KEY is shared."""
    app_services = [name for name, service in services.items() if service.get("build")]
    assert set(app_services) >= {"migrate", "web", "worker-gpu", "worker-cpu"}
    for name in app_services:
        env = services[name]["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
        assert env["DATABASE_URL"].startswith("postgres://"), name
        assert env["PLAYGROUND_DATA_DIR"] == "/data" and env["SECRET_KEY"].startswith("${SECRET_KEY:?"), name
        assert "volumes" not in services[name], name
        if name != "migrate":
            assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "RUN python -m inference.models.bundled" in (REPO_DIR / "Dockerfile").read_text()


def test_the_web_server_takes_websocket_messages_and_frames_up_to_16_mib(services: dict) -> None:
    """daphne's defaults (1 MiB each) drop a larger message without a close frame; the
    consumer's own limit answers `message_too_large` instead (docs/reliability.md)."""
    dockerfile = (REPO_DIR / "Dockerfile").read_text()
    for command in (services["web"]["command"], dockerfile):
        for option in ("--websocket-max-message-size", "--websocket-max-frame-size"):
            assert option in command
    command = services["web"]["command"]
    assert command[command.index("--websocket-max-frame-size") + 1] == str(16 * 1024 * 1024)


def test_workers_reconnect_to_a_restarted_redis(services: dict) -> None:
    """Without gossip, mingle and event heartbeats (scripts/worker.py RECONNECT_OPTIONS)."""
    from scripts.worker import RECONNECT_OPTIONS

    for name in ("worker-gpu", "worker-cpu", "worker-prefill", "worker-decode"):
        assert set(RECONNECT_OPTIONS) <= set(services[name]["command"]), name
    assert " ".join(RECONNECT_OPTIONS) in (REPO_DIR / "Makefile").read_text()
