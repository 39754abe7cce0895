"""The layers of docs/architecture.md import only downward; llama and engine never import Dagster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
# Lower number = lower layer. Top-level modules not listed here sit above everything.
# `errors` and `paths` are single modules, `settings` and `state` packages, below everything. The entry points (`cli/`,
# `definitions.py`, `api/`) sit above everything; the bench is a package of its own (test_bench_boundary.py).
LAYERS = {
    "errors": 0,
    "crash_points": 0,
    "redaction": 0,
    "settings": 0,
    "paths": 0,
    "state": 0,
    "llama": 1,
    "engine": 2,
    "tasks": 3,
    # What is generated and how a partition is run (stages, rows, the registry): no Dagster.
    "pipeline": 3,
    "storage": 4,
    "warehouse": 4,
    "defs": 5,
    # What a trainer reads (row shapes, kd rows, the card): no Dagster (beside defs).
    "exports": 5,
}


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
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", [name for name in LAYERS if LAYERS[name] > 0])
def test_a_layer_imports_only_itself_and_lower_layers(layer: str) -> None:
    own = LAYERS[layer]
    for path in (PACKAGE / layer).rglob("*.py"):
        for module in _imports(path):
            target = _layer(module)
            assert target is None or target <= own, f"{path.name} imports {module}"


def test_the_root_exception_module_imports_nothing_of_the_package() -> None:
    """Every layer derives its errors from kimi_batch.errors, so it must sit below them all."""
    assert not any(m.startswith("kimi_batch") for m in _imports(PACKAGE / "errors.py"))


# defs/webhook.py, the alert poster beside the alerts, is plain HTTP: free of Dagster too.
@pytest.mark.parametrize("layer", ["llama", "engine", "pipeline", "defs/webhook.py"])
def test_llama_and_engine_never_import_dagster(layer: str) -> None:
    paths = [PACKAGE / layer] if layer.endswith(".py") else (PACKAGE / layer).rglob("*.py")
    for path in paths:
        assert not any(m.split(".")[0] == "dagster" for m in _imports(path)), path.name


def test_tests_share_code_only_through_the_support_package() -> None:
    """No test module imports another test module or conftest: shared code lives in support/."""
    for path in TESTS.rglob("*.py"):
        for module in _imports(path):
            assert not module.startswith("."), f"{path.relative_to(TESTS)}: relative {module}"
            if module.split(".")[0] == "kimi_batch_tests":
                assert module.startswith("kimi_batch_tests.support"), (
                    f"{path.relative_to(TESTS)} imports {module}"
                )


def test_test_packages_hold_no_code() -> None:
    """An `__init__.py` of the tests is a docstring at most, so nothing runs at import."""
    for path in TESTS.rglob("__init__.py"):
        body = ast.parse(path.read_text()).body
        assert all(
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body
        ), path.relative_to(TESTS)


FACADES = ("settings", "state", "llama", "engine", "pipeline", "storage", "warehouse")


@pytest.mark.parametrize("facade", FACADES)
def test_other_layers_import_the_facade_not_its_modules(facade: str) -> None:
    """`from kimi_batch.llama import X`: the package `__all__` is the surface other layers use."""
    inside = PACKAGE / facade
    # The bench beside the package (kimi_batch_bench/) uses the same surface.
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "kimi_batch_bench").rglob("*.py")]:
        if path.is_relative_to(inside):
            continue
        for module in _imports(path):
            assert not module.startswith(f"kimi_batch.{facade}."), (
                f"{path.relative_to(PACKAGE.parent)} imports {module}: use kimi_batch.{facade}"
            )


@pytest.mark.parametrize("facade", FACADES)
def test_modules_of_a_package_import_their_siblings_not_its_facade(facade: str) -> None:
    """The facade imports every module, so a module importing the facade would be a cycle."""
    for path in (PACKAGE / facade).rglob("*.py"):
        if path.name != "__init__.py":
            assert f"kimi_batch.{facade}" not in _imports(path), path.name
