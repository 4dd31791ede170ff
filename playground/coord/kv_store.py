"""Where a prefill worker leaves a KV blob for a decode worker: Redis (chunked) or a shared directory.

Owns: blob names, chunking, expiry and deletion. Every blob expires `ttl_s` after it was
stored, so a blob no decode worker picks up never leaks. Must not know: what a blob holds
(`inference.kv.transfer`), generations, Celery. No torch: the web process may import it.

`PLAYGROUND_KV_STORE` picks the store: `redis` (the default: the Redis every worker already
reaches) or `file:/path` (a directory all workers mount, e.g. a fast local disk or NFS).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Protocol

import redis

from playground.coord import keys

CHUNK_BYTES = 4 * 1024 * 1024  # one Redis value each: big values block Redis for everyone else
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class BlobMissing(LookupError):
    """The blob is not there: never stored, expired, or already taken."""


BlobBytes = bytes | bytearray | memoryview


class BlobStore(Protocol):
    ttl_s: float

    def put(self, name: str, blob: BlobBytes) -> None: ...
    def get(self, name: str) -> BlobBytes: ...
    def delete(self, name: str) -> None: ...


def check_name(name: str) -> str:
    """Names come from task arguments: keep them to a safe alphabet (no paths, no key patterns)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"blob name {name!r} must be 1-200 letters, digits, '_', '.' or '-'")
    return name


class RedisBlobStore:
    """A manifest `playground:kv:<name>` and chunks `playground:kv:<name>:<n>`, all with the same TTL."""

    def __init__(self, client: redis.Redis, ttl_s: float, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.client, self.ttl_s, self.chunk_bytes = client, ttl_s, chunk_bytes

    def put(self, name: str, blob: BlobBytes) -> None:
        view = memoryview(blob).cast("B")
        num_chunks = max(1, -(-len(view) // self.chunk_bytes))
        ttl_ms = int(self.ttl_s * 1000)
        # One MULTI: a reader sees the manifest only together with every chunk.
        with self.client.pipeline(transaction=True) as pipe:
            for n in range(num_chunks):
                pipe.set(self._chunk_key(name, n), view[n * self.chunk_bytes : (n + 1) * self.chunk_bytes], px=ttl_ms)
            pipe.set(
                self._manifest_key(name), json.dumps({"num_chunks": num_chunks, "num_bytes": len(view)}), px=ttl_ms
            )
            pipe.execute()

    def get(self, name: str) -> bytes:
        manifest = self._manifest(name)
        chunks = self.client.mget([self._chunk_key(name, n) for n in range(manifest["num_chunks"])])
        if any(chunk is None for chunk in chunks):
            raise BlobMissing(f"blob {name!r} expired while it was being read")
        blob = b"".join(chunks)
        if len(blob) != manifest["num_bytes"]:
            raise BlobMissing(f"blob {name!r} is incomplete: {len(blob)} of {manifest['num_bytes']} bytes")
        return blob

    def delete(self, name: str) -> None:
        try:
            num_chunks = self._manifest(name)["num_chunks"]
        except BlobMissing:
            return  # gone already; any chunk left over expires on its own
        self.client.delete(self._manifest_key(name), *(self._chunk_key(name, n) for n in range(num_chunks)))

    def _manifest(self, name: str) -> dict[str, int]:
        raw = self.client.get(self._manifest_key(name))
        if raw is None:
            raise BlobMissing(f"blob {name!r} does not exist (expired after {self.ttl_s:g} s, or already taken)")
        return json.loads(raw)

    @staticmethod
    def _manifest_key(name: str) -> str:
        return keys.kv_blob(check_name(name))

    @staticmethod
    def _chunk_key(name: str, n: int) -> str:
        return f"{keys.kv_blob(check_name(name))}:{n}"


class FileBlobStore:
    """One file `<directory>/<name>.kv` per blob; its age (mtime) decides whether it expired."""

    SUFFIX = ".kv"

    def __init__(self, directory: str | Path, ttl_s: float) -> None:
        self.directory, self.ttl_s = Path(directory), ttl_s

    def put(self, name: str, blob: BlobBytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._sweep()
        path = self._path(name)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_bytes(blob)
        os.replace(partial, path)  # atomic: a reader never sees half a blob

    def get(self, name: str) -> bytes:
        path = self._path(name)
        try:
            if self._is_expired(path):
                path.unlink(missing_ok=True)
                raise BlobMissing(f"blob {name!r} expired (older than {self.ttl_s:g} s)")
            return path.read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"blob {name!r} does not exist in {self.directory} (expired, or already taken)") from None

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / (check_name(name) + self.SUFFIX)

    def _is_expired(self, path: Path) -> bool:
        return time.time() - path.stat().st_mtime > self.ttl_s

    def _sweep(self) -> None:
        """Deletes expired blobs: the file store has no server to expire them."""
        for path in self.directory.glob("*" + self.SUFFIX):
            try:
                if self._is_expired(path):
                    path.unlink(missing_ok=True)
            except FileNotFoundError:
                pass  # another worker swept it first


def open_store(spec: str, ttl_s: float, redis_client: redis.Redis) -> BlobStore:
    """The store `spec` names: `redis` or `file:/path`."""
    if spec == "redis":
        return RedisBlobStore(redis_client, ttl_s)
    if spec.startswith("file:") and spec[len("file:") :]:
        return FileBlobStore(spec[len("file:") :], ttl_s)
    raise ValueError(f"PLAYGROUND_KV_STORE={spec!r} must be 'redis' or 'file:/a/shared/directory'")
