"""The function tools a row may offer the model: an inbox row's `tools` and a Batch API line's
are checked by the same models (the class names stay `_Tool`/`_Function`: JSON schemas and error
messages name them). Every string a row sends or stores is valid Unicode (`UnicodeText`), the
strings inside a tool's free-form `parameters` too, and every number in those is one JSON spells
(`sendable_json`, with the JSON readers' `formats.number_spelling`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from kimi_batch.inputs.formats import number_spelling

# A lone surrogate (from a JSON `\ud800` escape) is not Unicode: UTF-8 encoding of the request,
# the request key and the Parquet writer would all fail on it later.
_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_error(value: str) -> str | None:
    """Why `value` is not valid Unicode (where its first lone surrogate is), or None."""
    if value.isascii() or not (found := _SURROGATE.search(value)):
        return None
    return (
        f"has a lone surrogate {found.group()!r} at character {found.start()} (not valid "
        "Unicode: a broken escape or a mis-decoded file)"
    )


def unicode_text(value: str) -> str:
    """`value` if it is valid Unicode; a lone surrogate raises ValueError saying where it is."""
    if (error := unicode_error(value)) is not None:
        raise ValueError(error)
    return value


# Every string that is sent or stored goes through this check.
UnicodeText = Annotated[str, AfterValidator(unicode_text)]


# Where a value sits in its JSON: its parent's place and its key or index (None: the value).
_Place = tuple["_Place", str | int] | None


def _path(place: _Place) -> str:
    steps: list[str | int] = []
    while place is not None:
        place, step = place
        steps.append(step)
    return "".join(
        f"[{step}]" if isinstance(step, int) else (f".{step}" if i else step)
        for i, step in enumerate(reversed(steps))
    )


def sendable_json(value: Any) -> Any:
    """`value` if a request can carry it as JSON text: every string in it, keys included, valid
    Unicode (one lone surrogate would fail the write of every row of its partition), and every
    number one strict JSON spells (`number_spelling`: a NaN stored would fail the row's request
    in the run, and every later run of its partition). Walked without recursion, and a place's
    path is only spelled out for the reason, so a value nested as deeply as JSON allows costs no
    more than its size."""
    pending: list[tuple[_Place, Any]] = [(None, value)]
    while pending:
        place, item = pending.pop()
        if isinstance(item, str) and (error := unicode_error(item)) is not None:
            raise ValueError(f"{_path(place)}: {error}" if place else error)
        if (spelling := number_spelling(item)) is not None:
            error = f"is {spelling}, which no request can carry (llama-server reads doubles)"
            raise ValueError(f"{_path(place)} {error}" if place else error)
        if isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and (error := unicode_error(key)) is not None:
                    raise ValueError(f"a key{f' of `{_path(place)}`' if place else ''} {error}")
                pending.append(((place, str(key)), inner))
        elif isinstance(item, list):
            pending.extend(((place, index), inner) for index, inner in enumerate(item))
    return value


class _Function(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: UnicodeText | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return sendable_json(value)


class _Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: _Function


FunctionTool = _Tool
ToolFunction = _Function
