"""No module of the package is over 400 lines: a longer one does more than one job, split it."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "kimi_batch"
MAX_LINES = 400
# Known exceptions, each with the reason. bench/standin.py (the time-scaled stand-in of the
# target) is being split on another branch (issue 18's "no module over 400 lines"): remove this
# entry when that split is merged; the second test below fails once it is no longer needed.
KNOWN_LONGER = {"bench/standin.py"}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _modules() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): _lines(path) for path in PACKAGE.rglob("*.py")}


def test_no_module_is_over_400_lines() -> None:
    longer = {
        module: lines
        for module, lines in _modules().items()
        if lines > MAX_LINES and module not in KNOWN_LONGER
    }
    assert not longer, f"modules over {MAX_LINES} lines (split them by job): {longer}"


def test_every_known_exception_is_still_longer() -> None:
    """An exception that no longer applies is removed, so it cannot hide a module grown back."""
    modules = _modules()
    stale = sorted(m for m in KNOWN_LONGER if modules.get(m, 0) <= MAX_LINES)
    assert not stale, f"remove from KNOWN_LONGER, now {MAX_LINES} lines or fewer: {stale}"
