"""Sizes: no function over 60 lines, no module over 500 (docs/architecture.md, "Sizes").

A function over 60 lines does more than one thing; argument-parser builders are the exception (a
flat list of `add_argument` calls reads best in one place). Modules are sized by concept: about 400
lines is the guideline, and a module may pass it when its one concept needs the room, but a module
over 500 lines holds two concepts. Never split one thought into two files that call back and forth.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_batch"
# The bench beside the package (`kimi_batch_bench/`) keeps the same function size.
BENCH = PACKAGE.parent / "kimi_batch_bench"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
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


def test_no_module_is_over_500_lines() -> None:
    longer = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not longer, f"modules over {MAX_MODULE_LINES} lines (two concepts: split them): {longer}"
