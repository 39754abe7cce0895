"""A Java properties value (`kimi_batch.storage.property_value`), server-free.

- Any text, surrogates included (a Java string is UTF-16), written as `key=<value>` reads back
  through `Properties.load`'s rules (ISO-8859-1, backslash escapes) as that text; the line is
  printable ASCII, so nothing is left for Latin-1 to mangle.
- The file run on its own, as `scripts/trino.sh` and `scripts/s3proxy.sh` run it with any
  Python 3, prints the same escape of its argument.
"""

from __future__ import annotations

import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.storage import property_value
from kimi_batch_tests.support.java_properties import read_like_java
from kimi_batch_tests.support.repo import REPO_ROOT

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCRIPT = REPO_ROOT / "kimi_batch" / "storage" / "java_properties.py"
_ODD = " \\\t\r\n\f:=#!ü€😀\x00\x7f\x85\u2028"
CHARACTERS = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from(_ODD))
TEXT = st.text(CHARACTERS, max_size=30)


@EXAMPLES
@given(value=TEXT)
def test_any_value_reads_back_as_java_reads_it(value: str) -> None:
    line = f"key={property_value(value)}\n"
    assert all(" " <= char <= "~" for char in line[:-1])
    # As Java holds it: UTF-16 units, where a high and a low surrogate side by side are one.
    java = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert read_like_java(line.encode("latin-1")) == {"key": java}


def test_the_file_run_by_itself_prints_the_escape_of_its_argument() -> None:
    value = " /home/kimi hüme\\x/€😀\nnext"
    printed = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), value],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert printed.stdout == property_value(value) + "\n"
    assert read_like_java(f"key={printed.stdout}".encode("latin-1")) == {"key": value}
