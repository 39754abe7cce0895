"""The layers of docs/architecture.md import only downward; llama, engine and the feature packages
never import Dagster; other packages import a package's facade, not its modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
# Lower number = lower layer; a module's layer is its longest listed prefix. Anything not listed
# (the entry points: `cli/`, `definitions.py`, the Batch API's server `batch_api/web/`) sits above
# everything; the bench is a package of its own (test_bench_boundary.py).
LAYERS = {
    # The ground: the root exception, configuration, the state layout and databases.
    "errors": 0,
    "crash_points": 0,
    "redaction": 0,
    "settings": 0,
    "paths": 0,
    "state": 0,
    # The file primitives the features share (owner-only writes, content-addressed blobs).
    "storage": 0,
    "llama": 1,
    "engine": 2,
    # One package per feature, side by side, none of them Dagster: what comes in, what is
    # generated, its quality, where it is kept, the Batch API, what a trainer reads.
    "inputs": 3,
    "pipeline": 3,
    "quality": 3,
    "warehouse": 3,
    "batch_api": 3,
    "exports": 3,
    # The Dagster adapter over the features.
    "defs": 4,
    # The Batch API's HTTP server starts the batches' runs itself when no daemon does (Dagster).
    "batch_api.web": 99,
}
FEATURES = [name for name, layer in LAYERS.items() if layer == 3]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "kimi_batch" or len(parts) < 2:
        return None
    for end in range(len(parts), 1, -1):
        if ".".join(parts[1:end]) in LAYERS:
            return LAYERS[".".join(parts[1:end])]
    return 99


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


@pytest.mark.parametrize("layer", [name for name in LAYERS if 0 < LAYERS[name] < 99])
def test_a_layer_imports_only_itself_and_lower_layers(layer: str) -> None:
    for path in (PACKAGE / layer.replace(".", "/")).rglob("*.py"):
        own = _layer(_module_of(path))
        assert own is not None
        for module in _imports(path):
            target = _layer(module)
            assert target is None or target <= own, f"{path.name} imports {module}"


@pytest.mark.parametrize("feature", FEATURES)
def test_the_features_never_import_dagster(feature: str) -> None:
    """Dagster is the adapter's (`defs/`) and the entry points'; a feature runs without it."""
    for path in (PACKAGE / feature).rglob("*.py"):
        if _layer(_module_of(path)) == LAYERS[feature]:
            assert not any(m.split(".")[0] == "dagster" for m in _imports(path)), path.name


@pytest.mark.parametrize("feature", FEATURES)
def test_a_feature_package_imports_first_in_a_fresh_interpreter(feature: str) -> None:
    """Features import each other's facades; a cycle between two facades breaks whichever is
    imported first, so each one is imported first once."""
    assert (PACKAGE / feature).is_dir(), f"LAYERS names kimi_batch.{feature}, which is gone"
    run = subprocess.run(
        [sys.executable, "-c", f"import kimi_batch.{feature}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE.parent,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_root_exception_module_imports_nothing_of_the_package() -> None:
    """Every layer derives its errors from kimi_batch.errors, so it must sit below them all."""
    assert not any(m.startswith("kimi_batch") for m in _imports(PACKAGE / "errors.py"))


@pytest.mark.parametrize("layer", ["llama", "engine", "pipeline"])
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


FACADES = (
    "settings",
    "state",
    "llama",
    "engine",
    "pipeline",
    "storage",
    "warehouse",
    "inputs",
    "quality",
    "batch_api",
    "batch_api.web",
    "exports",
)


def _facade_of(module: str) -> str | None:
    """The facade a module belongs to: its longest facade prefix (a sub-package may be one)."""
    owners = [
        f for f in FACADES if module == f"kimi_batch.{f}" or module.startswith(f"kimi_batch.{f}.")
    ]
    return max(owners, key=len) if owners else None


@pytest.mark.parametrize("facade", FACADES)
def test_other_layers_import_the_facade_not_its_modules(facade: str) -> None:
    """`from kimi_batch.llama import X`: the package `__all__` is the surface other layers use."""
    # The bench beside the package (kimi_batch_bench/) uses the same surface.
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "kimi_batch_bench").rglob("*.py")]:
        if path.is_relative_to(PACKAGE) and _facade_of(_module_of(path)) == facade:
            continue
        for module in _imports(path):
            assert not (
                module.startswith(f"kimi_batch.{facade}.") and _facade_of(module) == facade
            ), f"{path.relative_to(PACKAGE.parent)} imports {module}: use kimi_batch.{facade}"


@pytest.mark.parametrize("facade", FACADES)
def test_modules_of_a_package_import_their_siblings_not_its_facade(facade: str) -> None:
    """The facade imports every module, so a module importing the facade would be a cycle."""
    for path in (PACKAGE / facade.replace(".", "/")).rglob("*.py"):
        if path.name != "__init__.py" and _facade_of(_module_of(path)) == facade:
            assert f"kimi_batch.{facade}" not in _imports(path), path.name
