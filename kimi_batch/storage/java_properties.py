"""A value of a Java properties file as Java's `Properties.load` reads it back.

Trino reads its catalog and config files, s3proxy its `--properties` file, as ISO-8859-1 with
backslash escapes (`Properties.load` over a stream: airlift's `loadPropertiesFrom`, s3proxy's
`Main`), and the Trino launcher reads `node.properties` by the same rules. `kimi-batch publish`
writes the catalog file with it; `scripts/trino.sh` and `scripts/s3proxy.sh` call it for each
value they write that comes from a path (a home folder's `ü` or `\\`), running this file:

    python3 kimi_batch/storage/java_properties.py VALUE    # prints VALUE escaped

It imports nothing but the standard library, so that any Python 3 runs it at once (importing
`kimi_batch.warehouse` takes seconds and the project's virtual environment).
"""

from __future__ import annotations

import sys


def property_value(value: str) -> str:
    """`value` as Java's `Properties.load` reads it back from a file read as ISO-8859-1: a
    character past printable ASCII (a password's, a home folder's `ü`) is a `\\uXXXX` escape of
    its UTF-16 units, not UTF-8 bytes read as Latin-1; a backslash is doubled, and a leading
    space escaped (Java skips it)."""
    escaped = []
    for char in value:
        if char == "\\":
            escaped.append("\\\\")
        elif " " <= char <= "~":
            escaped.append(char)
        else:
            units = char.encode("utf-16-be", "surrogatepass")
            escaped += [f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2)]
    text = "".join(escaped)
    return "\\" + text if text.startswith(" ") else text


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(property_value(argument))
