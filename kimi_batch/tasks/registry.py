"""The registered generation stages: their tables are output tables, their tags are known.

A stage's declaration (`kimi_batch.defs.stages.declare_stage`) registers its task here, as does
the asset factory `kimi_batch.defs.assets.stage_asset.generation_asset`; the built-in tasks are
registered below, so the layers that never import the declarations (storage, the CLI's export and
publish) know their tables. Storage builds its table list from here (`kimi_batch.warehouse.TABLES`),
and `kimi-batch status` maps ledger tags to tables with it.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, TypeVar

from kimi_batch.tasks.amplify import AmplifyTask
from kimi_batch.tasks.api_batch import ApiBatchTask
from kimi_batch.tasks.distill import DistillTask
from kimi_batch.tasks.generation_task import GenerationTask
from kimi_batch.tasks.judge import JudgeTask
from kimi_batch.tasks.tags import RequestTag

__all__ = ["STAGES", "register_stage", "stage_of_tag", "unregister_stage"]

TaskT = TypeVar("TaskT", bound=type[GenerationTask[Any, Any]])

_STAGES: dict[str, type[GenerationTask[Any, Any]]] = {}
STAGES: Mapping[str, type[GenerationTask[Any, Any]]] = types.MappingProxyType(_STAGES)
"""Stage name -> stage class, in registration order (a live, read-only view)."""

_RESERVED_TABLES = frozenset({"seeds", "quarantine"})


def register_stage(task: TaskT) -> TaskT:
    """Make a stage known (idempotent); usable as a class decorator.

    Stages may share a table when they share its row model (the Batch API's answers are
    `distilled` rows); ValueError when another stage has the name, or the table with another
    row model.
    """
    known = _STAGES.get(task.name)
    if known is task:
        return task
    if known is not None:
        raise ValueError(f"stage {task.name!r} is already {known.__name__}")
    if task.table in _RESERVED_TABLES:
        raise ValueError(f"table {task.table!r} of stage {task.name!r} is not a stage's table")
    for other in _STAGES.values():
        if other.table == task.table and other.row_model is not task.row_model:
            raise ValueError(
                f"table {task.table!r} of stage {task.name!r} is {other.name!r}'s, with rows "
                f"{other.row_model.__name__}, not {task.row_model.__name__}"
            )
    _STAGES[task.name] = task
    return task


def unregister_stage(task: type[GenerationTask[Any, Any]]) -> None:
    """Forget a stage registered by `register_stage` (a test's own); no-op if it is not."""
    if _STAGES.get(task.name) is task:
        del _STAGES[task.name]


def stage_of_tag(tag: str) -> type[GenerationTask[Any, Any]] | None:
    """The registered stage whose request carried `tag` (a ledger row's), or None."""
    try:
        return _STAGES.get(RequestTag.parse(tag).stage)
    except ValueError:
        return None


register_stage(AmplifyTask)
register_stage(DistillTask)
register_stage(JudgeTask)
register_stage(ApiBatchTask)
