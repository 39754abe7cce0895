"""docs/architecture.md names every module of the package and of the bench (its "Modules" table)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
# The bench's rows name it from the repository root (`kimi_batch_bench/run.py`).
BENCH = TESTS.parent / "kimi_batch_bench"
DOC = TESTS.parent / "docs" / "architecture.md"


def _modules_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Modules\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _path(module: str) -> Path:
    return TESTS.parent / module if module.startswith(f"{BENCH.name}/") else PACKAGE / module


def test_every_package_module_is_in_the_architecture_doc() -> None:
    section = _modules_section()
    modules = sorted(
        path.relative_to(root).as_posix()
        for root, folder in ((PACKAGE, PACKAGE), (TESTS.parent, BENCH))
        for path in folder.rglob("*.py")
        if path.name != "__init__.py"
    )
    missing = [module for module in modules if f"| `{module}` |" not in section]
    assert not missing, f"docs/architecture.md, section Modules, lacks: {', '.join(missing)}"


def test_the_architecture_doc_names_no_module_that_is_gone() -> None:
    section = _modules_section()
    named = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    gone = [module for module in named if not _path(module).is_file()]
    assert not gone, f"docs/architecture.md names modules that do not exist: {', '.join(gone)}"


def _layer_rows() -> list[tuple[str, str]]:
    """(package folder, job) of each row of the layers table that names one package."""
    text = DOC.read_text(encoding="utf-8")
    rows = []
    for line in text[: text.index("\n## ", text.index("| # | Package | Job |"))].splitlines():
        cells = line.split(" | ")
        if len(cells) == 3 and re.fullmatch(r"`kimi_batch/\w+/`", cells[1]):
            rows.append((cells[1].strip("`"), cells[2]))
    return rows


def test_the_layers_table_names_only_modules_of_its_package() -> None:
    """A package's row names its modules in backquotes (`ledger`): each must exist there."""
    rows = _layer_rows()
    assert len(rows) >= 10, "the layers table was not found"
    gone = [
        f"{folder}{name}"
        for folder, job in rows
        for name in re.findall(r"`([a-z_]+)`", job)
        if not (TESTS.parent / folder / f"{name}.py").is_file()
        and not (TESTS.parent / folder / name).is_dir()
    ]
    assert not gone, f"docs/architecture.md's layers table names modules that do not exist: {gone}"
