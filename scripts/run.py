"""`make run`'s process supervisor: Redis (found or started), one Celery worker, daphne.

Owns: the order processes start and stop in, the environment they share (REDIS_URL), and
the restart rule: a child that dies is started again after a backoff (1 s, doubling to 30 s
while it keeps dying within a minute of its start), and the others keep running, so a
crashed worker costs its users one `worker_lost` each and nothing else; one that dies
`MAX_QUICK_DEATHS` times in a row soon after starting is broken, and then everything stops
with its name. Only Ctrl-C (SIGINT) or SIGTERM stops everything (a second Ctrl-C kills at
once). A hand-written supervisor rather than supervisord or honcho: it is one file, needs no
config file or extra dependency, and `make run` must work on a bare machine. Must not know: migrations, static files or
the model (the Makefile prepares those before this runs).

Settings (environment): HOST (127.0.0.1), PORT (8000), REDIS_URL (redis://127.0.0.1:6379/0),
PLAYGROUND_DATA_DIR (<repo>/data), WORKER_QUEUES (gpu,celery).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))  # run as a script: make `scripts.*` importable

from scripts.net import http_status  # noqa: E402
from scripts.processes import Service  # noqa: E402
from scripts.redis_server import DEFAULT_REDIS_URL, find_or_start_redis  # noqa: E402
from scripts.worker import worker_argv  # noqa: E402

POLL_S = 0.2
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
QUICK_DEATH_S = 60.0  # a child that dies sooner than this after its start counts as dying quickly
MAX_QUICK_DEATHS = 5


class ForceStop(Exception):
    """A second Ctrl-C while stopping: skip the grace periods."""


class Supervisor:
    def __init__(self) -> None:
        self.services: list[Service] = []  # in start order; stopped in reverse
        self.stop_signal: int | None = None
        self.started_at: dict[str, float] = {}
        self.quick_deaths: dict[str, int] = {}

    def on_signal(self, signum: int, frame: object) -> None:
        if self.stop_signal is not None:
            raise ForceStop()
        self.stop_signal = signum
        say(f"got {signal.Signals(signum).name}: stopping (press Ctrl-C again to kill)")

    def start(self, service: Service) -> Service:
        self.services.append(service.start())
        self.started_at[service.name] = time.monotonic()
        say(f"started {service.name} (pid {service.pid}): {' '.join(service.argv)}")
        return service

    def dead_service(self) -> Service | None:
        return next((s for s in self.services if not s.is_alive()), None)

    def restart(self, dead: Service) -> bool:
        """Starts a dead child again after its backoff (signals still stop everything meanwhile);
        False when it keeps dying right after its start (then the caller stops the rest)."""
        ran_s = time.monotonic() - self.started_at.get(dead.name, 0.0)
        quick = self.quick_deaths.get(dead.name, 0) + 1 if ran_s < QUICK_DEATH_S else 0
        self.quick_deaths[dead.name] = quick
        say(f"{dead.name} (pid {dead.pid}) exited with code {dead.returncode} after {ran_s:.0f} s")
        dead.kill()  # reap it and anything it left in its group
        if quick >= MAX_QUICK_DEATHS:
            say(f"{dead.name} died {quick} times within {QUICK_DEATH_S:.0f} s of starting; stopping the rest")
            return False
        backoff_s = min(FIRST_BACKOFF_S * 2 ** max(quick - 1, 0), MAX_BACKOFF_S)
        say(f"restarting {dead.name} in {backoff_s:.0f} s")
        deadline = time.monotonic() + backoff_s
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self.stop_signal is not None:
            return True
        fresh = Service(
            dead.name, dead.argv, env=dead.env, cwd=dead.cwd, log_path=dead.log_path, prefix_output=dead.prefix_output
        )
        self.services[self.services.index(dead)] = fresh
        self.started_at[fresh.name] = time.monotonic()
        fresh.start()
        say(f"started {fresh.name} (pid {fresh.pid}): {' '.join(fresh.argv)}")
        return True

    def stop_all(self) -> None:
        try:
            for service in reversed(self.services):
                if service.is_alive():
                    say(f"stopping {service.name} (pid {service.pid})")
                service.stop(grace_s=10.0)
        except ForceStop:
            for service in self.services:
                service.kill()
        say("all processes stopped")


def say(message: str) -> None:
    print(f"   run | {message}", flush=True)


def child_env(redis_url: str, data_dir: Path) -> dict[str, str]:
    return os.environ | {
        "REDIS_URL": redis_url,
        "PLAYGROUND_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "playground.settings"),
        "PYTHONUNBUFFERED": "1",
    }


# Messages up to 16 MiB reach the consumer, which refuses those over PLAYGROUND_MAX_MESSAGE_BYTES
# with `message_too_large` and keeps the socket; daphne's own 1 MiB limits would drop the
# connection without a close frame. Both limits: a client that does not fragment sends a
# message as one frame, and the frame limit is checked first. (docker-compose.yml and the
# Dockerfile pass the same.)
WEBSOCKET_LIMIT_BYTES = 16 * 1024 * 1024
DAPHNE_OPTIONS = [
    "--websocket-max-message-size",
    str(WEBSOCKET_LIMIT_BYTES),
    "--websocket-max-frame-size",
    str(WEBSOCKET_LIMIT_BYTES),
]


def web_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), *DAPHNE_OPTIONS, "playground.asgi:application"]


def supervise(supervisor: Supervisor, host: str, port: int) -> int:
    """Start everything, announce the URL once daphne answers, then watch for deaths."""
    data_dir = Path(os.environ.get("PLAYGROUND_DATA_DIR", REPO_DIR / "data")).resolve()
    redis, redis_url = find_or_start_redis(
        os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), data_dir / "redis", log_path=data_dir / "redis" / "redis.log"
    )
    if redis is None:
        say(f"using the Redis that answers at {redis_url}")
    else:
        supervisor.services.append(redis)
        supervisor.started_at[redis.name] = time.monotonic()
        say(f"started redis (pid {redis.pid}) at {redis_url}, log in {redis.log_path}")
    env = child_env(redis_url, data_dir)
    queues = os.environ.get("WORKER_QUEUES", "gpu,celery")
    supervisor.start(Service("worker", worker_argv(queues, "gpu@%h"), env=env, cwd=REPO_DIR, prefix_output=True))
    supervisor.start(Service("web", web_argv(host, port), env=env, cwd=REPO_DIR, prefix_output=True))
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"
    is_announced = False
    while supervisor.stop_signal is None:
        dead = supervisor.dead_service()
        if dead is not None and not supervisor.restart(dead):
            return 1
        if not is_announced and (status := http_status(url, timeout_s=2)) is not None:
            note = "" if status == 200 else f" (it answers HTTP {status}: see the web log above)"
            say(f"Open {url}{note}")
            is_announced = True
        time.sleep(POLL_S)
    return 0


def port_from_env() -> int:
    value = os.environ.get("PORT", "8000")
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"PORT={value!r} must be a port number (1-65535)")
    return int(value)


def main() -> int:
    supervisor = Supervisor()
    signal.signal(signal.SIGINT, supervisor.on_signal)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    try:
        return supervise(supervisor, os.environ.get("HOST", "127.0.0.1"), port_from_env())
    except ForceStop:
        return 130
    except Exception as error:  # a start-up failure: say it plainly, still stop what started
        say(f"error: {error}")
        return 1
    finally:
        supervisor.stop_all()


if __name__ == "__main__":
    sys.exit(main())
