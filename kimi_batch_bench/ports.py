"""A free loopback port for the servers a bench starts (its llama-server, the stand-in)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
