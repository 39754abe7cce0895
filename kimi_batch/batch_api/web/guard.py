"""Who reaches the Batch API: a known Host, no cross-origin browser, the bearer key.

`Guard` is ASGI middleware in front of every route (`/openapi.json` and unknown paths included),
checking the request's headers before any route runs or any body byte is read, in this order:

1. `Host` names the server (loopback names, the bind host, `KIMI_BATCH_API_ALLOWED_HOSTS`),
   any port: else 421. A web page that rebinds its DNS name to 127.0.0.1 sends its own name.
2. No CORS: an `OPTIONS` preflight, an `Origin` other than the server's own, or a browser's
   `Sec-Fetch-Site: cross-site` is 403. Browsers send `Origin` on every cross-origin POST,
   including the "simple" `text/plain` ones that need no preflight.
3. `Authorization: Bearer <key>`, compared in constant time: else 401. No key only with
   `--no-auth` (`ApiAccess.key` None).
"""

from __future__ import annotations

import hmac
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kimi_batch.batch_api.web.errors import ApiError, error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Addresses one binds to, never one a client names.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class ApiAccess(BaseModel):
    """What the guard lets through: the key (None: `--no-auth`) and the Host names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(
        repr=False, min_length=1, description="The bearer key; None only with --no-auth."
    )
    bound_host: str = Field(description="The address the server binds (a Host it answers).")
    allowed_hosts: tuple[str, ...] = Field(
        default=(), description="More Host names (KIMI_BATCH_API_ALLOWED_HOSTS)."
    )
    key_file: Path | None = Field(default=None, description="Where a generated key is kept.")

    @property
    def host_names(self) -> frozenset[str]:
        named = {host_name(host) for host in (self.bound_host, *self.allowed_hosts)}
        return LOOPBACK_NAMES | {name for name in named if name and name not in _WILDCARDS}


def host_name(value: str) -> str | None:
    """The name of a Host header without its port: `[::1]:8090` -> `::1`; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        port = value[end + 1 :] if end > 0 else ":x"
        if port and not (port.startswith(":") and port[1:].isdigit()):
            return None
        return value[1:end]
    if value.count(":") > 1:  # a bare IPv6 address, as some clients send it
        return value
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


class Guard:
    """ASGI middleware: refuses a request on its headers alone (see the module docstring)."""

    def __init__(self, app: ASGIApp, access: ApiAccess) -> None:
        self.app = app
        self.names = access.host_names
        self.expected = access.key.encode() if access.key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route speaks it; refuse before any handshake
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http":
            refusal = self.refusal(Headers(scope=scope), scope["method"])
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, method: str) -> ApiError | None:
        host = headers.get("host", "")
        if host_name(host) not in self.names:
            return ApiError(
                421,
                f"this server does not answer for Host {host[:100]!r} "
                "(add it to KIMI_BATCH_API_ALLOWED_HOSTS)",
                code="unknown_host",
            )
        origin = headers.get("origin")
        own = (f"http://{host}", f"https://{host}")
        cross_site = headers.get("sec-fetch-site") in ("cross-site", "same-site")
        if method == "OPTIONS" or (origin is not None and origin not in own) or cross_site:
            return ApiError(
                403, "cross-origin requests are refused (no CORS)", code="cross_origin_refused"
            )
        if self.expected is not None:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            # The scheme is case-insensitive (RFC 9110); the key is compared in constant time.
            given = token.strip().encode() if scheme.lower() == "bearer" else b""
            if not hmac.compare_digest(given, self.expected):
                return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return None
