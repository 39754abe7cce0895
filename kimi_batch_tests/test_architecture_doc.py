"""docs/architecture.md names every module of the package and of the bench (its "Modules" table)."""

from __future__ import annotations

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
