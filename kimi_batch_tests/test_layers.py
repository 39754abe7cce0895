"""The layers of DESIGN.md import only downward; llama and engine never import Dagster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kimi_batch"
# Lower number = lower layer. Top-level modules not listed here sit above everything.
LAYERS = {"settings": 0, "paths": 0, "llama": 1, "engine": 2, "tasks": 3, "storage": 4, "defs": 5}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "kimi_batch" or len(parts) < 2:
        return None
    return LAYERS.get(parts[1], 99)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", [name for name in LAYERS if name != "settings"])
def test_a_layer_imports_only_itself_and_lower_layers(layer: str) -> None:
    own = LAYERS[layer]
    for path in (PACKAGE / layer).rglob("*.py"):
        for module in _imports(path):
            target = _layer(module)
            assert target is None or target <= own, f"{path.name} imports {module}"


@pytest.mark.parametrize("layer", ["llama", "engine"])
def test_llama_and_engine_never_import_dagster(layer: str) -> None:
    for path in (PACKAGE / layer).rglob("*.py"):
        assert not any(m.split(".")[0] == "dagster" for m in _imports(path)), path.name
