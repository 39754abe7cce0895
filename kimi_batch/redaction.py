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
    authority_end = len(rest.split("?", 1)[0].split("#", 1)[0])
    before, after = rest[:authority_end], rest[authority_end:]
    # The user info ends at the last `@` before the query: a password may hold `/` or `@`.
    if "@" in before:
        userinfo, _, hosts = before.rpartition("@")
        if ":" in userinfo:
            before = f"{userinfo.split(':', 1)[0]}:{MASK}@{hosts}"
    return f"{scheme}://{before}" + _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, after)


def url_secrets(url: str) -> set[str]:
    """The passwords `url` holds, as written and percent-decoded (for `masked_message`)."""
    raw: list[str] = []
    if _SCHEME.match(url):
        before = url.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0]
        userinfo = before.rpartition("@")[0]
        if ":" in userinfo:
            raw.append(userinfo.split(":", 1)[1])
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
