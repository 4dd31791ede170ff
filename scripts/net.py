"""Small network probes shared by the supervisor and the test fixtures: free ports and
"does this URL answer HTTP yet?". Must not know what listens there."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def is_port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_status(url: str, timeout_s: float = 5.0) -> int | None:
    """The HTTP status `url` answers with (errors included), or None while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, urllib.error.URLError):
        return None
