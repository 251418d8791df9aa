"""This host's network interfaces and their IPv4 addresses (Linux; elsewhere none)."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

__all__ = ["ipv4_interfaces"]

_SIOCGIFADDR = 0x8915


def ipv4_interfaces() -> list[tuple[str, str]]:
    """``(interface, IPv4 address)`` of every interface that has one, in the kernel's order."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
                found.append((name, socket.inet_ntoa(answer[20:24])))
    return found
