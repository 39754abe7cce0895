"""Reference pages drawn from schemas: the tables from their row models, the Batch API from OpenAPI.

Part of `kimi_batch.cli.reference` (`make reference`); the tables page lists `warehouse.TABLES`
(every registered stage's table), the API page `create_app(...).openapi()`.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kimi_batch.pipeline import GenerationColumns
from kimi_batch.settings import Settings, default_digest_path
from kimi_batch.warehouse import PARTITION_COLUMNS, TABLES, trino_columns

GENERATED = "Generated from the code by `make reference`; edit the code, not this page."
_PARTITION_MEANING = {
    "ds": "Partition: the day (YYYY-MM-DD) the input arrived; a directory, not in the files.",
    "source": "Partition: the input's source (file stem, or batch id); a directory too.",
}


def code(text: str) -> str:
    """`text` as inline code fit for a table cell. A `|` in it is written as an HTML entity
    inside `<code>`: GitHub splits a cell at every `|` not escaped, code spans included, while
    MkDocs (Python-Markdown) shows the escaping backslash of `\\|` inside a code span."""
    if "|" not in text:
        return f"`{text}`"
    return f"<code>{html.escape(text, quote=False).replace('|', '&#124;')}</code>"


# A code span: its backticks, then anything but a backtick, up to the same backticks.
_CODE_SPAN = re.compile(r"(`+)([^`]+?)\1")


def _plain(text: str) -> str:
    """Text outside code: `|` escaped, and `<`, `>`, `&` as entities (a help text's `<think>`
    would be an HTML tag, which both renderers hide)."""
    return html.escape(text, quote=False).replace("|", "\\|")


def cell(text: str) -> str:
    """Text fit for one Markdown table cell: one line, shown as written (a code span holding a
    `|` as `code` writes it)."""
    flat = " ".join(text.split())
    parts: list[str] = []
    end = 0
    for span in _CODE_SPAN.finditer(flat):
        parts.append(_plain(flat[end : span.start()]))
        parts.append(code(span.group(2)) if "|" in span.group(2) else span.group(0))
        end = span.end()
    parts.append(_plain(flat[end:]))
    return "".join(parts)


def _meanings(model: type[BaseModel]) -> dict[str, str]:
    """Each column's description; a contract column without one reads the generated rows'."""
    shared = GenerationColumns.model_fields
    return {
        name: field.description or (shared[name].description if name in shared else "") or ""
        for name, field in model.model_fields.items()
    }


def tables_page() -> str:
    lines = [
        "# Tables and columns",
        "",
        GENERATED,
        "",
        "Every table is an Apache Iceberg table (format version 2, partitioned by identity `ds`",
        "and `source`, the two partition columns last) whose schema is derived from its row",
        "model; Trino, polars and pyiceberg read it through the same catalog. Types are Trino's;",
        "a column is nullable when its row model allows null.",
    ]
    for table in TABLES:
        model = TABLES[table]
        meanings = _meanings(model)
        nullable = {
            name: "yes" if _allows_none(field.annotation) else ""
            for name, field in model.model_fields.items()
        }
        lines += ["", f"## `{table}`", ""]
        if model.__doc__:
            lines += [cell(model.__doc__), ""]
        lines += ["| Column | Type | Null | Meaning |", "| --- | --- | --- | --- |"]
        for name, trino_type in trino_columns(table):
            meaning = _PARTITION_MEANING.get(name, meanings.get(name, ""))
            null = "" if name in PARTITION_COLUMNS else nullable[name]
            lines.append(f"| `{name}` | `{trino_type}` | {null} | {cell(meaning)} |")
    return "\n".join(lines) + "\n"


def _allows_none(annotation: Any) -> bool:
    return type(None) in getattr(annotation, "__args__", ())


def _api_settings() -> Settings:
    """A deployment that exists nowhere: the schema does not depend on one."""
    home = Path("/kimi_batch_reference")
    return Settings(
        home=home, model=None, llama_server=None, llama_url=None, digest=default_digest_path()
    )


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    kind = str(schema.get("type", "any"))
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"object of {_schema_type(extra)}" if isinstance(extra, dict) else "object"
    return kind


def _parameters(operation: dict[str, Any]) -> list[str]:
    params = operation.get("parameters", [])
    if not params:
        return []
    lines = ["", "| Parameter | In | Type | Required |", "| --- | --- | --- | --- |"]
    for param in params:
        schema = param.get("schema", {})
        kind = _schema_type(schema)
        bounds = [f"{key} {schema[key]}" for key in ("minimum", "maximum") if key in schema]
        if "default" in schema:
            bounds.append(f"default {schema['default']}")
        if bounds:
            kind += f" ({', '.join(bounds)})"
        required = "yes" if param.get("required") else ""
        lines.append(f"| `{param['name']}` | {param['in']} | {cell(kind)} | {required} |")
    return lines


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    lines = ["", f"### `{method.upper()} {path}`", ""]
    lines.append(operation.get("description") or operation.get("summary", ""))
    lines += _parameters(operation)
    body = operation.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        lines += ["", f"Body (`{media}`): {_schema_type(content.get('schema', {}))}."]
    answers = [
        f"`{code}` {cell(answer.get('description', ''))}"
        for code, answer in operation.get("responses", {}).items()
    ]
    if answers:
        lines += ["", "Answers: " + "; ".join(answers) + "."]
    return lines


def _component(name: str, schema: dict[str, Any]) -> list[str]:
    lines = ["", f"### {name}", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    required = set(schema.get("required", []))
    properties: dict[str, Any] = schema.get("properties", {})
    lines += ["| Field | Type | Required | Meaning |", "| --- | --- | --- | --- |"]
    for field, spec in properties.items():
        mark = "yes" if field in required else ""
        meaning = cell(str(spec.get("description", "")))
        lines.append(f"| `{field}` | {cell(_schema_type(spec))} | {mark} | {meaning} |")
    return lines


def batch_api_page() -> str:
    from kimi_batch.batch_api.web import ApiAccess, create_app

    access = ApiAccess(key="reference", bound_host="127.0.0.1")
    schema = create_app(_api_settings(), access).openapi()
    lines = [
        "# Batch API endpoints",
        "",
        GENERATED,
        "",
        "`kimi-batch api` serves these routes (OpenAI's Batch API: the official `openai` client",
        'works against them). Errors have OpenAI\'s shape: `{"error": {"message", "type",',
        '"param", "code"}}`. How to use them: [the Batch API](../how-to/batch-api.md).',
        "",
        "## Routes",
    ]
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            lines += _operation(method, path, operation)
    components: dict[str, Any] = schema.get("components", {}).get("schemas", {})
    if components:
        lines += ["", "## Schemas"]
        for name, component in components.items():
            lines += _component(name, component)
    return "\n".join(lines) + "\n"
