"""The stage protocol's shared parts: the typed tag and its wire form, the registry, the sink."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kimi_batch.engine import GenerationRequest, GenerationResult
from kimi_batch.inputs.prompts import SeedPrompt
from kimi_batch.pipeline import (
    STAGE_DECLARATIONS,
    STAGES,
    AmplifiedRow,
    AmplifyTask,
    DistilledRow,
    DistillTask,
    GenerationColumns,
    GenerationTask,
    RequestTag,
    RowReader,
    SeedInputs,
    SetAside,
    StageDeclaration,
    StageSink,
    Strategy,
    declare_stage,
    generation_columns,
    stage_of_tag,
    withdraw_stage,
)
from kimi_batch.warehouse import TABLES
from kimi_batch_tests.support.results import make_result


def test_amplify_and_distill_tags_keep_the_wire_forms_ledgers_hold() -> None:
    cases = {
        "paraphrase": RequestTag(stage="amplify", strategy=Strategy.PARAPHRASE),
        "seed": RequestTag(stage="distill"),
        "variant:harder": RequestTag(stage="distill", origin="variant", strategy=Strategy.HARDER),
    }
    for wire, tag in cases.items():
        assert tag.wire == wire
        assert RequestTag.parse(wire) == tag


def test_another_stage_s_tag_round_trips_and_garbage_is_refused() -> None:
    tag = RequestTag(stage="judge", origin="variant", strategy=Strategy.RELATED)
    assert tag.wire == "judge/variant:related"
    assert RequestTag.parse(tag.wire) == tag
    assert RequestTag.parse(RequestTag(stage="judge").wire) == RequestTag(stage="judge")
    for wire in ("", "foo", "variant:nope", "judge/other", "Bad/seed", "judge/seed:nope"):
        with pytest.raises(ValueError, match="not a request tag"):
            RequestTag.parse(wire)


def test_ledger_tags_map_to_the_registered_stages_tables() -> None:
    assert stage_of_tag("harder") is AmplifyTask
    assert stage_of_tag("variant:related") is DistillTask
    assert stage_of_tag("nobody/seed") is None
    assert stage_of_tag("garbage") is None


class _Row(GenerationColumns):
    seed_id: str


class _EchoTask(GenerationTask[SeedInputs, _Row]):
    name = "test_echo"
    table = "test_echo_rows"
    row_model = _Row

    def load(self, read: RowReader) -> SeedInputs:
        return SeedInputs.read(read)

    def requests(self, inputs: SeedInputs) -> list[GenerationRequest]:
        return []

    def parse(self, result: GenerationResult, inputs: SeedInputs) -> _Row | SetAside:
        seed = inputs.seed_of(result)
        if result.empty:
            return SetAside(reason="empty", source_file=seed.source_file, line=seed.line)
        return _Row.model_validate({**generation_columns(result), "seed_id": seed.input_id})


@pytest.fixture
def forget_test_stages() -> Iterator[list[str]]:
    """The stages (asset names) a test declares, withdrawn after it: the registry is
    process-wide, and the reference pages (docs/reference/tables.md) are made from it by later
    tests."""
    declared: list[str] = []
    yield declared
    for asset in declared:
        withdraw_stage(asset)


def _declare(asset: str, task: type[GenerationTask[Any, Any]]) -> StageDeclaration:
    return declare_stage(asset=asset, task=task, description=f"{asset}: a test's stage")


def test_declaring_a_stage_makes_its_table_a_storage_table(
    forget_test_stages: list[str],
) -> None:
    forget_test_stages.append("test_echo")
    declaration = _declare("test_echo", _EchoTask)
    assert _declare("test_echo", _EchoTask) is declaration  # idempotent
    assert STAGES["test_echo"] is _EchoTask
    assert TABLES["test_echo_rows"] is _Row
    assert list(TABLES)[:3] == ["seeds", "amplified", "distilled"]
    assert list(TABLES)[-1] == "quarantine"
    withdraw_stage("test_echo")
    assert "test_echo" not in STAGES


def test_a_stage_may_share_a_table_only_with_the_same_row_model(
    forget_test_stages: list[str],
) -> None:
    class SameRows(_EchoTask):
        name = "test_echo_again"

    class OtherRows(_EchoTask):
        name = "test_echo_other"
        row_model = AmplifiedRow

    class SameName(_EchoTask):
        table = "test_echo_elsewhere"

    class Reserved(_EchoTask):
        name = "test_reserved"
        table = "quarantine"

    forget_test_stages.extend(["test_echo", "test_echo_again"])
    _declare("test_echo", _EchoTask)
    assert _declare("test_echo_again", SameRows).task is SameRows
    for index, task in enumerate((OtherRows, SameName, Reserved)):
        with pytest.raises(ValueError, match=r"stage|table|night field"):
            _declare(f"test_refused_{index}", task)
        assert f"test_refused_{index}" not in STAGE_DECLARATIONS
    assert TABLES["distilled"] is DistilledRow


def _seed(input_id: str, line: int) -> SeedPrompt:
    return SeedPrompt.model_validate(
        {
            "input_id": input_id,
            "messages": [{"role": "user", "content": f"prompt {input_id}"}],
            "prompt": f"prompt {input_id}",
            "source_file": "in.jsonl",
            "line": line,
        }
    )


def test_the_sink_owns_the_quarantine_rows_and_the_figures() -> None:
    inputs = SeedInputs(seeds=[_seed("s1", 1), _seed("s2", 2)])
    sink = StageSink(_EchoTask(), inputs)
    results = [
        make_result("one", request_id="a", input_id="s1"),
        make_result("  ", request_id="b", input_id="s2", finish_reason="length"),
        make_result("one again", request_id="a", input_id="s1"),
    ]
    rows = sink.rows(results)
    assert sink.quarantined == []  # nothing happens before the rows are consumed
    assert [row.request_id for row in rows] == ["a", "a"]
    (aside,) = sink.quarantined
    assert (aside.stage, aside.input_id, aside.line, aside.reason) == (
        "test_echo",
        "s2",
        2,
        "empty",
    )
    figures = sink.figures()
    assert (figures.results, figures.rows, figures.truncated, figures.empty) == (3, 2, 1, 1)
    assert figures.duplicate_request_ids == 1
    assert sink.dropped == 0
    assert sink.metadata() == {}
