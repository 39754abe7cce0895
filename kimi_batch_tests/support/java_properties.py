"""A Java properties file as Trino reads its catalog files (airlift's `loadPropertiesFrom`:
`Properties.load` over an `InputStream`, so ISO-8859-1), with the escapes `Properties.load`
documents; enough for the `key=value` lines a catalog file holds (no continuation lines)."""

from __future__ import annotations

import re

_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def read_like_java(data: bytes) -> dict[str, str]:
    """The file's properties by key, each value as Java reads it back."""
    found: dict[str, str] = {}
    for raw_line in re.split(r"\r\n|\r|\n", data.decode("latin-1")):
        line = raw_line.lstrip(" \t\f")
        if not line or line[0] in "#!":
            continue
        key, _, value = line.partition("=")  # a catalog's keys hold no escapes or separators
        found[key] = _unescaped(value.lstrip(" \t\f"))
    return found


def _unescaped(raw: str) -> str:
    units: list[str] = []
    at = 0
    while at < len(raw):
        char = raw[at]
        if char != "\\":
            units.append(char)
            at += 1
        elif raw[at + 1] == "u":
            units.append(chr(int(raw[at + 2 : at + 6], 16)))  # one UTF-16 unit
            at += 6
        else:
            units.append(_ESCAPED.get(raw[at + 1], raw[at + 1]))
            at += 2
    # Java's strings are UTF-16: a pair of escaped surrogates is one character.
    return "".join(units).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
