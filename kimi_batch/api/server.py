"""Serve the Batch API with uvicorn; loopback by default, never elsewhere without a key."""

from __future__ import annotations

import ipaddress
import socket

import uvicorn

from kimi_batch.api.app import create_app
from kimi_batch.errors import ConfigError
from kimi_batch.settings import Settings

__all__ = ["DEFAULT_HOST", "is_loopback", "serve"]

DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def serve(settings: Settings, *, host: str = DEFAULT_HOST, port: int | None = None) -> None:
    """Run the API until interrupted. Refuses a non-loopback address without KIMI_BATCH_API_KEY."""
    if not settings.api_key and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the Batch API on {host} without a key: set KIMI_BATCH_API_KEY "
            "(or bind 127.0.0.1)"
        )
    uvicorn.run(
        create_app(settings), host=host, port=port or settings.api_port, log_level="warning"
    )
