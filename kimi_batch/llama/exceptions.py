"""Errors raised by the llama-server client and the resident-server manager.

LlamaError (a kimi_batch.errors.KimiBatchError)
├── LlamaConnectionError      nothing answers at the base URL (refused, reset, DNS)
├── LlamaTimeoutError         the server accepted but did not answer in time
├── LlamaHTTPError            an HTTP error status (status, message)
│   ├── LlamaLoadingError     503 while the model loads
│   ├── LlamaServerError      other 5xx
│   ├── LlamaRequestError     4xx: the request itself is wrong (too long, bad params)
│   └── LlamaUnsupportedError 404/501: endpoint or feature not available on this build
│                             (an `error` event inside a streamed answer: the same, by its code)
├── LlamaResponseError        a 2xx body that does not parse as the documented shape
├── LlamaBodyTooLargeError    a response past the client's byte cap, or compressed though none
│                             was asked for: not retried (the same request answers alike)
├── LlamaFeatureError         the server would not apply what a request asks (a chat template
│                             that renders no tools): the request is not sent
├── LlamaBodyError            a request that cannot be written as JSON (a NaN or infinite
│                             number, a lone surrogate): the request is not sent
└── ServerSpawnError          the resident server could not be started or attached
    ├── SpecMismatchError     a server with another spec already runs (it is left running)
    └── ServerKilledError     the server (or the smoke test's) was killed by a signal
"""

from __future__ import annotations

from kimi_batch.errors import KimiBatchError


class LlamaError(KimiBatchError):
    """Base of every error of `kimi_batch.llama`."""


class LlamaConnectionError(LlamaError):
    pass


class LlamaTimeoutError(LlamaError):
    pass


class LlamaHTTPError(LlamaError):
    def __init__(self, status: int, message: str, *, url: str = "") -> None:
        super().__init__(f"HTTP {status} from {url or 'llama-server'}: {message}")
        self.status = status
        self.message = message
        self.url = url


class LlamaLoadingError(LlamaHTTPError):
    pass


class LlamaServerError(LlamaHTTPError):
    pass


class LlamaRequestError(LlamaHTTPError):
    pass


class LlamaUnsupportedError(LlamaHTTPError):
    pass


class LlamaBodyError(LlamaError):
    """A request body JSON cannot carry (NaN, an infinity, a lone surrogate): not sent, and
    no retry would change it."""


def http_error(status: int, message: str, *, url: str = "") -> LlamaHTTPError:
    """The typed error of an HTTP error status (or of a streamed `error` event's code)."""
    if status == 503:
        return LlamaLoadingError(status, message, url=url)
    if status in (404, 501):
        return LlamaUnsupportedError(status, message, url=url)
    if status >= 500:
        return LlamaServerError(status, message, url=url)
    return LlamaRequestError(status, message, url=url)


class LlamaFeatureError(LlamaError):
    """This server would quietly leave out part of the request: it is not sent (no retry)."""


class LlamaResponseError(LlamaError):
    pass


class LlamaBodyTooLargeError(LlamaError):
    """A response body past the client's byte cap (or one compressed though the client asked
    for none, whose size is only known once decoded): no retry would make it shorter."""


class ServerSpawnError(LlamaError):
    pass


class SpecMismatchError(ServerSpawnError):
    pass


class ServerKilledError(ServerSpawnError):
    """Killed by a signal (SIGSEGV at the first computation: a binary this CPU cannot run)."""

    def __init__(self, message: str, *, signal_name: str) -> None:
        super().__init__(message)
        self.signal_name = signal_name
