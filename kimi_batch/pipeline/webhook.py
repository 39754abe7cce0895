"""Alerts to a chat webhook: one short text message, Slack-compatible JSON (`{"text": ...}`).

The morning's alerts (`alerts`) say what; this module only delivers it. A webhook that is down
must never take a sensor down with it, so delivery problems come back as a `WebhookResult`, not
as an exception.
"""

from __future__ import annotations

import httpx
from pydantic import BaseModel, ConfigDict, Field

# Slack truncates long messages anyway; an alert that needs more belongs in the linked run page.
MAX_TEXT_CHARS = 3000
TIMEOUT_S = 10.0


class WebhookResult(BaseModel):
    """What happened to one message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delivered: bool
    status_code: int | None = Field(default=None, description="None when no response came.")
    error: str | None = None


def post_message(url: str, text: str, *, timeout_s: float = TIMEOUT_S) -> WebhookResult:
    """POST `{"text": text}` to `url` once; a 2xx answer counts as delivered."""
    # A lone surrogate (a file name read with surrogateescape, in an error) cannot be sent as
    # UTF-8: httpx raised UnicodeEncodeError out of the sensor. Pairs are joined, lone ones
    # become U+FFFD, before the cut (which then never parts a pair).
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    body = {"text": text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"}
    try:
        response = httpx.post(url, json=body, timeout=timeout_s)
    # InvalidURL is no HTTPError: a URL httpx cannot parse is a delivery problem like the rest.
    # So is a host no IDNA encoding holds (`xn--a.com`): idna raises its own UnicodeError (a
    # ValueError), which httpx lets through.
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as error:
        return WebhookResult(delivered=False, error=f"{type(error).__name__}: {error}")
    if response.is_success:
        return WebhookResult(delivered=True, status_code=response.status_code)
    return WebhookResult(
        delivered=False,
        status_code=response.status_code,
        error=f"HTTP {response.status_code}: {response.text[:200]}",
    )
