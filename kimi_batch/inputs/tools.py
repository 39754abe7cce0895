"""The function tools a row may offer the model: an inbox row's `tools` and a Batch API line's
are checked by the same models (the class names stay `_Tool`/`_Function`: JSON schemas and error
messages name them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Function(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: _Function


FunctionTool = _Tool
ToolFunction = _Function
