"""The watchdog's wire: ranks reach rank 0 over TCP and exchange newline-delimited JSON."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

from ...errors import UsageError
from ..interfaces import ipv4_interfaces
from .report import ENV

__all__ = ["own_addresses", "connect", "send_line", "Lines"]

_CONNECT_S = 30.0  # how long a rank tries to reach rank 0 at start


def own_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback first (any of them may reach rank 0)."""
    found = ["127.0.0.1"]
    for _, address in ipv4_interfaces():
        if address not in found:
            found.append(address)
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            if info[4][0] not in found:
                found.append(info[4][0])
    return found


def connect(addresses: list[str], port: int, rank: int) -> socket.socket:
    """Reach rank 0 at the first of ``addresses`` that answers, and say hello."""
    deadline = time.monotonic() + _CONNECT_S
    while True:
        for address in addresses:
            with contextlib.suppress(OSError):
                link = socket.create_connection((address, port), timeout=2.0)
                link.settimeout(None)
                send_line(link, {"hello": rank})
                return link
        if time.monotonic() > deadline:
            raise UsageError(
                f"{ENV}: rank {rank} cannot reach rank 0's watchdog at "
                f"{', '.join(addresses)} port {port}"
            )
        time.sleep(0.2)


def send_line(link: socket.socket, message: dict[str, Any]) -> bool:
    """Send one message; False when the peer has gone."""
    try:
        link.sendall((json.dumps(message, default=str) + "\n").encode())
        return True
    except OSError:
        return False


class Lines:
    """Newline-delimited JSON messages from a socket, read without blocking."""

    def __init__(self, link: socket.socket) -> None:
        self.link = link
        self.buffer = b""

    def read(self) -> list[dict[str, Any]] | None:
        """The complete messages that have arrived; None once the peer has closed."""
        try:
            data = self.link.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out
