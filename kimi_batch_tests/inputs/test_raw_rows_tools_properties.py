"""Hostile `tools` in an inbox row (issue 45 item 2): whatever the column holds, the row is a seed
whose tools are OpenAI function tools, or a quarantine row with a reason naming `tools`; never
a crash, never dropped, and never a number the request's JSON cannot carry."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.inputs.reader import read_inbox_file

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_NAMES = st.one_of(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True), st.text(max_size=70))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**309, -(10**400)])  # past a double's range
    | st.floats()  # NaN and the infinities too: Python's JSON writes and reads them
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
_TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "retrieval", ""]), "function": st.fixed_dictionaries(
        {"name": _NAMES}, optional={"description": st.text(max_size=20), "parameters": _JSON}
    )}
)  # fmt: skip
_TOOLS = st.one_of(st.lists(st.one_of(_TOOL, _JSON), max_size=4), _JSON)


@EXAMPLES
@given(tools=_TOOLS, as_text=st.booleans())
def test_a_row_s_tools_are_function_tools_or_the_row_is_quarantined(
    tools: Any, as_text: bool
) -> None:
    row = {"id": "r", "prompt": "Weather?", "tools": json.dumps(tools) if as_text else tools}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "in.jsonl"
        path.write_text(json.dumps(row) + "\n")
        batch = read_inbox_file(path)
    assert len(batch.seeds) + len(batch.quarantined) == 1
    if batch.quarantined:
        assert "tools" in batch.quarantined[0].reason
        return
    kept = batch.seeds[0].params.tools
    if tools is None:  # no tools (or JSON `null` in a text cell)
        assert kept is None
        return
    assert kept is not None
    assert [tool["function"]["name"] for tool in kept] == [
        tool["function"]["name"] for tool in tools
    ]
    for tool in kept:
        assert tool["type"] == "function"
        assert 1 <= len(tool["function"]["name"]) <= 64
    # A kept row's tools go out as strict JSON, which llama-server reads as doubles: no NaN or
    # infinity, and no integer past a double's range.
    json.loads(json.dumps(kept, allow_nan=False), parse_int=_double)


def _double(text: str) -> float:
    number = float(text)
    assert math.isfinite(number), text
    return number
