"""docs/architecture.md names every module of the package (its "Modules" table)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
DOC = TESTS.parent / "docs" / "architecture.md"


def _modules_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Modules\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_package_module_is_in_the_architecture_doc() -> None:
    section = _modules_section()
    modules = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    )
    missing = [module for module in modules if f"| `{module}` |" not in section]
    assert not missing, f"docs/architecture.md, section Modules, lacks: {', '.join(missing)}"


def test_the_architecture_doc_names_no_module_that_is_gone() -> None:
    section = _modules_section()
    named = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    gone = [module for module in named if not (PACKAGE / module).is_file()]
    assert not gone, f"docs/architecture.md names modules that do not exist: {', '.join(gone)}"
