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
    spans = [span for span in _readings(rest) if span]
    if spans:  # masked from where the readings start (the same `:`) to where the longest ends
        start, end = spans[0][0], max(stop for _, stop in spans)
        rest = rest[:start] + MASK + rest[end:]
    authority_end = len(rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0])
    before, after = rest[:authority_end], rest[authority_end:]
    return f"{scheme}://{before}" + _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, after)


# Where a URL's password lies past its `://`, (start, end), as each parser reads it.
Span = tuple[int, int] | None


def _password_of(userinfo: str) -> Span:
    colon = userinfo.find(":")
    return (colon + 1, len(userinfo)) if colon >= 0 else None


def _libpq_password(rest: str) -> Span:
    """libpq's (so psycopg's, the state databases'): the user info runs to the first `@`, unless
    a `/` comes first; `postgresql://u:pa?ss@db/kb` has the password `pa?ss`."""
    match = re.match(r"[^@/]*@", rest)
    return _password_of(match.group()[:-1]) if match else None


def _rfc_password(rest: str) -> Span:
    """RFC 3986's (urllib's): the authority ends at the first `/`, `?` or `#`, its user info at
    its last `@`."""
    authority = re.match(r"[^/?#]*", rest)
    userinfo = authority.group().rpartition("@")[0] if authority else ""
    return _password_of(userinfo) if userinfo else None


def _intended_password(rest: str) -> Span:
    """The password its writer may have meant where the parsers disagree (a `/` or an `@` in
    it, not percent-encoded): to the last `@` before the first `/` after the first `@`; none
    when that `@` is a query's (`/kb?user=me@tenant`: a `/`, then a `?`, come before it)."""
    first = rest.find("@")
    if first < 0 or ("?" in rest[:first] and "/" in rest[: rest.find("?")]):
        return None
    slash = rest.find("/", first)
    userinfo = rest[: rest.rfind("@", 0, slash if slash >= 0 else len(rest))]
    return _password_of(userinfo) if "/" not in userinfo.split(":", 1)[0] else None


def _readings(rest: str) -> tuple[Span, Span, Span]:
    return _libpq_password(rest), _rfc_password(rest), _intended_password(rest)


def readers_disagree(url: str) -> bool:
    """Whether the readings of `url`'s password differ (an `@`, `/`, `?` or `#` in its user info
    not percent-encoded): each consumer would log in with another one."""
    if not _SCHEME.match(url):
        return False
    rest = url.split("://", 1)[1]
    return len({rest[span[0] : span[1]] if span else None for span in _readings(rest)}) > 1


def url_secrets(url: str) -> set[str]:
    """The passwords `url` holds, as written and percent-decoded (for `masked_message`), in
    every reading of it."""
    raw: list[str] = []
    if _SCHEME.match(url):
        rest = url.split("://", 1)[1]
        raw += [rest[start:end] for start, end in filter(None, _readings(rest))]
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
