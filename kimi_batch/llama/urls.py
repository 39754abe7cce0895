"""Server URLs as they may be shown: credentials (`http://user:pass@host`) never leave the client."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

from kimi_batch.settings import hidden_user_info


def redact_url(url: str) -> str:
    """`url` without its user info; what logs, errors and the `endpoint` column carry."""
    parts = urlsplit(url)
    if hidden_user_info(url):
        # User info the parser cannot find (a '/', '?' or '#' in the password, unescaped):
        # everything up to the last '@' may be a secret.
        return f"{parts.scheme}://(credentials)@{url.rpartition('@')[2]}".rstrip("/")
    if parts.username is None and parts.password is None:
        return url.rstrip("/")
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)).rstrip("/")


def url_credentials(url: str) -> tuple[str, str] | None:
    """(user, password) from `url`'s user info, None without; sent as HTTP basic auth."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")
