"""Sizes: no function over 60 lines (docs/architecture.md, "Sizes").

A function over 60 lines does more than one thing; argument-parser builders are the exception (a
flat list of `add_argument` calls reads best in one place). Modules are sized by concept and have
no line cap: merging one thought into one module is allowed, and one thought is never split into
two files that call back and forth to fit a number.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_batch"
# The bench beside the package (`kimi_batch_bench/`) keeps the same function size.
BENCH = PACKAGE.parent / "kimi_batch_bench"
MAX_FUNCTION_LINES = 60
# The argument-parser builders: one `add_argument` per option, nothing else.
PARSER_BUILDERS = frozenset({"build_parser", "add_perf_commands"})


def _trees() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE.parent if path.is_relative_to(BENCH) else PACKAGE).as_posix(): (
            ast.parse(path.read_text(encoding="utf-8"))
        )
        for path in sorted([*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")])
    }


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_function_is_over_60_lines() -> None:
    longer = {
        f"{module}:{node.name}": lines
        for module, tree in _trees().items()
        for node in _functions(tree)
        if node.name not in PARSER_BUILDERS
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not longer, (
        f"functions over {MAX_FUNCTION_LINES} lines (split by what they do): {longer}"
    )


def test_the_parser_builders_it_spares_exist() -> None:
    names = {node.name for tree in _trees().values() for node in _functions(tree)}
    assert names >= PARSER_BUILDERS
