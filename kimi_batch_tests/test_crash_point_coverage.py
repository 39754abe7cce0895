"""Every durable write in the package has a crash point beside it (issue 42's sweep finds the rest).

A durable write is a rename into place (`os.replace`, `os.rename`, `Path.replace`/`rename`), a
state transaction or write-lock block (`.transaction()`, `._write_lock()`) or a warehouse
partition write (`.write_partition(...)`). The function that makes one calls `crash_point(NAME)`
after it, so the crash-point sweep (`test_crash_points.py`) can stop a process there and check
what a rerun makes of it. The few writes that are not pipeline state are listed below, each with
why.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kimi_batch.crash_points import declared_crash_points

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_batch"

# (module, function) -> why its write needs no crash point of its own.
NOT_STATE = {
    ("engine/speeds.py", "save"): "a measured speed, a hint for deadlines: rewritten each run",
    ("storage/blobs.py", "local"): "this host's cache of a content-addressed blob, refetched",
    ("storage/private_files.py", "private_writer"): "a one-shot output (export, key file): the "
    "command rewrites it whole",
    ("storage/private_files.py", "private_folder_swap"): "a one-shot output folder (an hf "
    "export): the command rewrites it whole",
    ("storage/private_files.py", "_remove_stale_temp_folders"): "puts back the older folder a "
    "swap killed between its renames left aside (export.folder_set_aside): done again by the "
    "next swap",
    ("state/database.py", "create"): "a store's schema (CREATE ... IF NOT EXISTS): idempotent",
    ("state/postgres.py", "transaction"): "the transaction primitive itself",
    ("state/postgres.py", "create"): "a store's schema (CREATE ... IF NOT EXISTS): idempotent",
    ("batch_api/store.py", "_write_lock"): "the write-lock primitive of its callers",
    ("batch_api/store.py", "_remove_if_unnamed"): "unlinks bytes no id names any more; its "
    "callers' crash points follow it (api.file_deleted, api.file_kept)",
    ("batch_api/store.py", "remove_unnamed_blobs"): "the API start's sweep of bytes no id "
    "names: done again by the next start",
    ("engine/ledger.py", "_confirmed"): "a lease's fence: the transaction its caller writes in "
    "(the caller's commit has the crash point: warehouse.partition_committed)",
    ("engine/ledger.py", "_try_lease"): "a lease: coordination that expires, not data",
    ("quality/dedup_index.py", "_take"): "the index's transaction, committed when "
    "DedupIndex.partition's block ends (quality.index_updated, quality.index_released)",
}

# `overwrite`: an Iceberg table's commit (warehouse/tables.py).
_WRITE_CALLS = frozenset({"transaction", "_write_lock", "write_partition", "overwrite"})


def _is_durable_write(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "os":
            return func.attr in ("replace", "rename")
        if func.attr in _WRITE_CALLS:
            return True
        # Path.replace(target) / Path.rename(target): one argument, no keywords (str.replace
        # takes two, datetime.replace keywords).
        return func.attr in ("replace", "rename") and len(call.args) == 1 and not call.keywords
    return False


def _is_crash_point(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id == "crash_point"


def _scopes(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(name, node) of the module's top level and of every function."""
    found: list[tuple[str, ast.AST]] = [("<module>", tree)]
    found += [
        (node.name, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return found


def _own_calls(scope: ast.AST) -> list[ast.Call]:
    """The calls in `scope`, not those of the functions nested in it."""
    calls: list[ast.Call] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return calls


def unguarded_writes(package: Path = PACKAGE) -> dict[tuple[str, str], list[int]]:
    """(module, function) -> lines of its durable writes with no crash point after them."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        for name, scope in _scopes(ast.parse(path.read_text(encoding="utf-8"))):
            calls = _own_calls(scope)
            points = [c.lineno for c in calls if _is_crash_point(c)]
            lines = sorted(
                c.lineno
                for c in calls
                if _is_durable_write(c) and not any(p > c.lineno for p in points)
            )
            if lines:
                found[(module, name)] = lines
    return found


def test_every_durable_write_has_a_crash_point_after_it() -> None:
    missing = {key: lines for key, lines in unguarded_writes().items() if key not in NOT_STATE}
    assert not missing, (
        "durable writes without a crash_point(NAME) after them in the same function "
        f"(add one, or say in NOT_STATE why it is not pipeline state): {missing}"
    )


def test_the_writes_it_spares_are_still_there() -> None:
    # A stale entry would spare a function that one day writes state again.
    assert set(NOT_STATE) <= set(unguarded_writes())


def test_the_scan_finds_a_write_without_a_crash_point(tmp_path: Path) -> None:
    (tmp_path / "writer.py").write_text(
        "import os\n"
        "def kept(a, b):\n    os.replace(a, b)\n    crash_point('x.kept')\n"
        "def lost(a, b, db):\n    with db.transaction():\n        pass\n    a.rename(b)\n"
        "def early(a, b):\n    crash_point('x.early')\n    os.replace(a, b)\n"
        "def text(s):\n    return s.replace('a', 'b')\n",
        encoding="utf-8",
    )
    assert unguarded_writes(tmp_path) == {
        ("writer.py", "lost"): [6, 8],
        ("writer.py", "early"): [11],
    }
    assert declared_crash_points(tmp_path) == {
        "x.kept": ["writer.py:4"],
        "x.early": ["writer.py:10"],
    }


def test_crash_point_names_are_dotted_and_each_marks_one_kind_of_write() -> None:
    declared = declared_crash_points()
    assert len(declared) >= 15, declared
    odd = [n for n in declared if not all(part.isidentifier() for part in n.split("."))]
    assert not odd, odd
    assert all(name.count(".") == 1 for name in declared), declared
