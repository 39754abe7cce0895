"""Secrets shown masked: a database URL or libpq conninfo string, and a message that may echo one.

The state database's URL (`KIMI_BATCH_DATABASE_URL`, `state migrate`'s target) may carry its
password three ways, as libpq reads them: `postgresql://user:PASSWORD@host/db`, a query parameter
`?password=PASSWORD` (or `sslpassword=`), and a conninfo string `host=h password='PASSWORD'`.
`masked_url` shows each as `***`; it is what every message, report and repr shows of such a URL.
`masked_message` also takes out of a text (a libpq error) the password as the URL spells it:
libpq's parse errors quote the token they could not read (`invalid percent-encoded token:
"s3cr%t"`), which may be the password itself.

Written here rather than taken from a library: SQLAlchemy's `URL.render_as_string(hide_password=
True)` masks only the user info, and psycopg's `conninfo_to_dict` raises on exactly the malformed
URLs whose errors must be masked.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
# `password=...` / `sslpassword=...` as a URL query parameter (up to the next `&` or `#`).
_QUERY_SECRET = re.compile(r"(?i)([?&][a-z_]*password=)([^&#]*)")
# `password=...` in a conninfo string: a quoted value (backslash escapes) or up to whitespace.
_CONNINFO_SECRET = re.compile(r"(?i)(\b[a-z_]*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def masked_url(url: str) -> str:
    """`url` with every password it holds shown as `***` (user info, query, conninfo)."""
    if not _SCHEME.match(url):
        return _CONNINFO_SECRET.sub(lambda m: m.group(1) + MASK, url)
    scheme, rest = url.split("://", 1)
    userinfo, password, hosts = _user_info(rest)
    if password is not None:
        rest = f"{userinfo.split(':', 1)[0]}:{MASK}@{hosts}"
    # The query: what follows the user info's `@` and the hosts (a query may hold an `@`).
    authority_end = len(rest.split("?", 1)[0].split("#", 1)[0])
    before, after = rest[:authority_end], rest[authority_end:]
    return f"{scheme}://{before}" + _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, after)


def _user_info(rest: str) -> tuple[str, str | None, str]:
    """(user info, its password or None, what follows its `@`) of a URL past its `://`.

    The widest reading of every parser's: libpq and SQLAlchemy end the password at an `@`, not
    at a `?`, `#` or `/` (`postgresql://u:pa?ss@db/kb` has the password `pa?ss`), and a password
    may hold an `@` of its own, so the user info runs to the last `@` of the URL; a query's
    `@` (`?application_name=me@box`) only masks more than it needs to."""
    if "@" not in rest:
        return "", None, rest
    userinfo, _, hosts = rest.rpartition("@")
    if ":" not in userinfo:
        return userinfo, None, hosts
    return userinfo, userinfo.split(":", 1)[1], hosts


def url_secrets(url: str) -> set[str]:
    """The passwords `url` holds, as written and percent-decoded (for `masked_message`)."""
    raw: list[str] = []
    if _SCHEME.match(url):
        rest = url.split("://", 1)[1]
        password = _user_info(rest)[1]
        if password is not None:
            # Ended at each of its `@`: libpq and SQLAlchemy end it at the first, a user who
            # did not percent-encode one meant a later one.
            parts = password.split("@")
            raw += ["@".join(parts[:end]) for end in range(1, len(parts) + 1)]
        raw.extend(match.group(2) for match in _QUERY_SECRET.finditer(url))
    else:
        raw.extend(match.group(2).strip("'") for match in _CONNINFO_SECRET.finditer(url))
    return {form for secret in raw for form in (secret, unquote(secret)) if form}


def masked_message(text: str, url: str) -> str:
    """`text` (an error about `url`) without the passwords of `url`, however it quotes them."""
    # Longest first: a password that contains another one's text is replaced whole.
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
