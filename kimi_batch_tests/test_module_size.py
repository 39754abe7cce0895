"""No module of the package is over 400 lines: a longer one does more than one job, split it."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
MAX_LINES = 400


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _modules() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): _lines(path) for path in PACKAGE.rglob("*.py")}


def test_no_module_is_over_400_lines() -> None:
    longer = {module: lines for module, lines in _modules().items() if lines > MAX_LINES}
    assert not longer, f"modules over {MAX_LINES} lines (split them by job): {longer}"
