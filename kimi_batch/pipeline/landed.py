"""A stage's partition landed, no Dagster: its rows and quarantine written under its lease, the
input version it consumed, its data version, and the figures its record carries.

`write_stage` writes a planned partition's rows (through the quality gate when the stage is
gated and the gate on: contamination and duplicates set aside, the kept rows indexed under the
lease once the block ends) and its quarantine. A commit is the publication: Trino, polars and
pyiceberg read the tables' catalog and see it on their next query, so nothing is registered
after it. The Dagster adapter (`defs/assets/landing.py`) judges the checks and records it.

A stage's partition has a data version (`stage_data_version`) made from what determines its
rows: its input version and its requests' identities (the ledger answers each request once), so
a partition built twice from the same input by the same stage carries the same version, whichever
run built it.

`StageSink`: where a stage's results go, and the one owner of what they leave behind.

The sink drives the stage's `parse` over the results as they stream from the ledger, passes the
rows on (to the Parquet writer), and keeps everything else itself: the quarantine rows (outputs
set aside, requests that failed) and the figures the asset checks judge. Nothing is held but
those: the rows are never collected.

The checks every generation stage's partition is judged by, no Dagster: their names and their
verdicts (the Dagster adapter turns them into asset check results).

`truncation_rate` fails above `TRUNCATION_FAIL_RATE` (those answers are set aside, so most of the
work would be in quarantine). A quality-gated stage's partition (the teacher's answers) carries
two more: `benchmark_contamination` fails above `KIMI_BATCH_CONTAMINATION_MAX_RATE` (the inputs
overlap what the student is evaluated on) and `duplicate_rate` warns when most of a partition
repeats earlier nights (an input dropped again under another name, say). The rows are in
quarantine either way: the checks tell a person, the gate already kept them out.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.crash_points import crash_point
from kimi_batch.engine import BatchOutcome, FailedRequest, GenerationResult
from kimi_batch.pipeline.driver import HeldPartition, StagePlan, plan_partition
from kimi_batch.pipeline.generation_task import GenerationTask, RowReader, SetAside
from kimi_batch.pipeline.rows import (
    INPUT_STAGE,
    GenerationColumns,
    QuarantineRow,
    failure_rows,
    result_row,
)
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.warehouse import PartitionWrite, Warehouse, polars_schema

# ---- `StageSink`: where a stage's results go ----------------------------------------------------


InputsT = TypeVar("InputsT")
RowT = TypeVar("RowT", bound=GenerationColumns)


class CheckFigures(BaseModel):
    """What the checks of one landed partition are judged on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    results: int
    truncated: int
    empty: int
    rows: int
    duplicate_request_ids: int

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.results if self.results else 0.0


class StageSink(Generic[InputsT, RowT]):
    """One stage run's results in, rows out; quarantine rows and figures kept here."""

    def __init__(
        self, task: GenerationTask[InputsT, RowT], inputs: InputsT, *, input_sha256: str = ""
    ) -> None:
        self._task = task
        self._inputs = inputs
        # The landed input version the inputs were built from: every row and set-aside carries it.
        self._input_sha256 = input_sha256
        self._quarantined: list[QuarantineRow] = []
        self._results = self._truncated = self._empty = 0
        self._parsed = self._rows = self._duplicates = 0
        self._ids: set[str] = set()
        self._sums: Counter[str] = Counter()

    def rows(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        """The stage's rows of `results`, one at a time; set-asides stay in the sink."""
        for row in self._task.keep(
            self._parse(self._task.order(self._count(results))), self._inputs
        ):
            self._rows += 1
            self._duplicates += row.request_id in self._ids
            self._ids.add(row.request_id)
            self._sums.update(self._task.measure(row))
            yield row.model_copy(update={"input_sha256": self._input_sha256})

    def _count(self, results: Iterable[GenerationResult]) -> Iterator[GenerationResult]:
        for result in results:
            self._results += 1
            self._truncated += result.truncated
            self._empty += result.empty
            yield result

    def _parse(self, results: Iterable[GenerationResult]) -> Iterator[RowT]:
        for result in results:
            parsed = self._task.parse(result, self._inputs)
            if isinstance(parsed, SetAside):
                self._quarantined.append(
                    result_row(
                        result,
                        stage=self._task.name,
                        source_file=parsed.source_file,
                        line=parsed.line,
                        reason=parsed.reason,
                    )
                )
                continue
            self._parsed += 1
            yield parsed

    def failed(
        self,
        failures: Sequence[FailedRequest],
        *,
        source_file: str,
        model: str,
        digest_sha: str,
        created_at: datetime,
    ) -> None:
        """Requests that failed after every attempt, as quarantine rows (a rerun retries them)."""
        self._quarantined.extend(
            failure_rows(
                failures,
                stage=self._task.name,
                source_file=source_file,
                model=model,
                digest_sha=digest_sha,
                created_at=created_at,
            )
        )

    @property
    def quarantined(self) -> list[QuarantineRow]:
        """Outputs set aside (in the order they were parsed), then failed requests."""
        sha = self._input_sha256 or None
        return [row.model_copy(update={"input_sha256": sha}) for row in self._quarantined]

    @property
    def dropped(self) -> int:
        """Parsed rows the stage's `keep` left out (e.g. duplicates)."""
        return self._parsed - self._rows

    def figures(self) -> CheckFigures:
        return CheckFigures(
            results=self._results,
            truncated=self._truncated,
            empty=self._empty,
            rows=self._rows,
            duplicate_request_ids=self._duplicates,
        )

    def metadata(self) -> dict[str, float]:
        """The stage's own figures for the materialization (e.g. duplicates dropped, scores)."""
        metric = self._task.dropped_metric
        dropped = {metric: self.dropped} if metric else {}
        return {**dropped, **self._task.summarize(self._sums, self._rows)}


# ---- the checks a partition is judged by --------------------------------------------------------


TRUNCATION_CHECK = "truncation_rate"
# The quality-gated stages' share of rows sharing an n-gram with a benchmark (fails above the
# configured rate), and of rows repeating kept ones (warns; not an alert: they are set aside).
CONTAMINATION_CHECK = "benchmark_contamination"
DUPLICATE_CHECK = "duplicate_rate"
CHECK_NAMES = (
    "no_duplicate_request_ids",
    TRUNCATION_CHECK,
    "no_empty_outputs",
    "matches_table_schema",
)
# Above this share of answers cut off at max_tokens the truncation check fails (ERROR): those
# answers are set aside, so most of the night's work would be in quarantine.
TRUNCATION_FAIL_RATE = 0.25
# Above this share of a partition's rows repeating kept ones, `duplicate_rate` warns.
DUPLICATE_WARN_RATE = 0.5


@dataclass(frozen=True)
class CheckVerdict:
    """One check of one partition: passed or not, what it saw; `warn`: a warning, not an error."""

    name: str
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    warn: bool = False


def stage_check_names(task: type[GenerationTask[Any, Any]]) -> tuple[str, ...]:
    """The checks a stage's partition is judged by: every stage's, and the gate's when gated."""
    gated = (CONTAMINATION_CHECK, DUPLICATE_CHECK) if task.quality_gated else ()
    return (*CHECK_NAMES, *gated)


def generation_verdicts(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[CheckVerdict]:
    """Duplicate request ids, truncation rate (fails above TRUNCATION_FAIL_RATE), empty outputs
    (set aside included), and schema."""
    expected = polars_schema(table)
    return [
        CheckVerdict(
            "no_duplicate_request_ids",
            figures.duplicate_request_ids == 0,
            {"duplicates": figures.duplicate_request_ids},
        ),
        CheckVerdict(
            TRUNCATION_CHECK,
            figures.truncation_rate <= TRUNCATION_FAIL_RATE,
            {
                "truncated": figures.truncated,
                "rate": round(figures.truncation_rate, 3),
                "threshold": TRUNCATION_FAIL_RATE,
            },
        ),
        CheckVerdict("no_empty_outputs", figures.empty == 0, {"empty": figures.empty}, warn=True),
        CheckVerdict(
            "matches_table_schema",
            dict(written) == dict(expected),
            {"columns": len(written), "expected_columns": len(expected)},
        ),
    ]


def quality_verdicts(screen: PartitionGate | None, gate: QualityGate) -> list[CheckVerdict]:
    """The partition's contamination and duplicate checks (passed, saying so, when the gate is
    off: every gated stage's partition reports both)."""
    if screen is None:
        off = {"gate": "off (KIMI_BATCH_DEDUP off, no KIMI_BATCH_BENCHMARKS)"}
        return [
            CheckVerdict(name, True, dict(off)) for name in (CONTAMINATION_CHECK, DUPLICATE_CHECK)
        ]
    counts = screen.counts
    max_rate = gate.settings.contamination_max_rate
    contamination = CheckVerdict(
        CONTAMINATION_CHECK,
        counts.contamination_rate <= max_rate,
        {
            "contaminated": counts.contaminated,
            "screened": counts.screened,
            "rate": round(counts.contamination_rate, 4),
            "max_rate": max_rate,
            "benchmarks": ", ".join(screen.benchmark_files) or "none configured",
        },
    )
    duplicates = CheckVerdict(
        DUPLICATE_CHECK,
        counts.duplicate_rate <= DUPLICATE_WARN_RATE,
        {
            "duplicates": counts.duplicates,
            "near_duplicates": counts.near_duplicates,
            "screened": counts.screened,
            "rate": round(counts.duplicate_rate, 4),
            "warn_rate": DUPLICATE_WARN_RATE,
            "dedup": "on" if screen.dedup else "off",
        },
        warn=True,
    )
    return [contamination, duplicates]


# ---- the landing --------------------------------------------------------------------------------


Task = GenerationTask[Any, Any]


@dataclass(frozen=True)
class StageWrite:
    """A partition's rows and quarantine, written: what its checks and record are made of."""

    written: PartitionWrite
    quarantined: int
    sink: StageSink[Any, Any]
    screen: PartitionGate | None


@contextmanager
def screening(
    gate: QualityGate | None,
    store: Warehouse,
    task: Task,
    inputs: Any,
    partition: tuple[str, str],
    held: HeldPartition,
) -> Iterator[PartitionGate | None]:
    """The partition's screening when its stage is gated and the gate on (else None); its kept
    rows are indexed, under its lease, when the block ends without an error."""
    if gate is None or not gate.screens(task):
        yield None
        if gate is not None and task.quality_gated:
            gate.release(*partition)  # landed unscreened: its old index entries must not answer
        return
    ds, source = partition
    with gate.partition(store, task, inputs, ds, source, guard=held.check) as screen:
        yield screen


def write_stage(
    plan: StagePlan,
    held: HeldPartition,
    outcome: BatchOutcome,
    results: Iterable[GenerationResult],
    *,
    store: Warehouse,
    gate: QualityGate | None = None,
) -> StageWrite:
    """Write the partition's rows (screened by `gate`) and its quarantine (lease held)."""
    task, ds, source = plan.task, plan.ds, plan.source
    sink = StageSink(task, plan.inputs, input_sha256=plan.input_sha)
    with screening(gate, store, task, plan.inputs, (ds, source), held) as screen:
        rows = sink.rows(results)
        written = store.write_partition(
            task.table, ds, source, screen.admit(rows) if screen else rows, guard=held.lease
        )
        crash_point("stage.rows_written")
        sink.failed(
            outcome.failures,
            source_file=source,
            model=outcome.model,
            digest_sha=outcome.digest_sha256,
            created_at=datetime.now(UTC),
        )
        set_aside = [*sink.quarantined, *(screen.quarantined if screen else ())]
        quarantined = store.replace_quarantine(ds, source, task.name, set_aside, guard=held.lease)
    return StageWrite(written=written, quarantined=quarantined, sink=sink, screen=screen)


def stage_data_version(plan: StagePlan, outcome: BatchOutcome) -> str:
    """The partition's data version: its table, input version, and the ids of the requests its
    rows come from and of those that failed (each id names a ledger key: digest, model, params,
    messages, sample), so the same input through the same stage gives the same version."""
    digest = hashlib.sha256(f"{plan.task.table}\n{plan.input_sha}\n".encode())
    for request_id in sorted(row.request_id for row in outcome.planned):
        digest.update(f"{request_id}\n".encode())
    for request_id in sorted(failure.request_id for failure in outcome.failures):
        digest.update(f"failed {request_id}\n".encode())
    return digest.hexdigest()


def consumed_input_sha(store: Warehouse, ds: str, source: str) -> str:
    """The landed input version the partition's `seeds` were built from ("" before any).

    A file of only bad lines leaves no seed row: the version is then its input quarantine rows'
    (every line set aside is stamped with it), so the partition consumed its input, its outputs
    are empty, and it is not stale the next night.
    """
    shas = store.read_partition("seeds", ds, source).get_column("input_sha256").drop_nulls()
    if shas.is_empty():
        set_aside = store.read_partition("quarantine", ds, source)
        shas = set_aside.filter(pl.col("stage") == INPUT_STAGE).get_column("input_sha256")
        shas = shas.drop_nulls()
    return str(shas.unique().sort()[-1]) if len(shas) else ""


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` from the warehouse and build its requests."""
    read: RowReader = lambda table, model: store.read_rows(table, ds, source, model)  # noqa: E731
    return plan_partition(task, read, ds, source, consumed_input_sha(store, ds, source))


def generation_figures(outcome: BatchOutcome) -> dict[str, float | int | str]:
    """The engine's figures of one batch: tok/s to 0.1, ms to 1, ratios to 0.001."""
    stats = outcome.stats
    return {
        "requests": stats.total,
        "generated": stats.generated,
        "from_ledger": stats.from_ledger,
        "failures": stats.failed,
        "not_started": stats.not_started,
        "truncated": stats.truncated,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.cached_tokens,
        "prompt_tokens_per_s": round(stats.prompt_tokens_per_s, 1),
        "completion_tokens_per_s": round(stats.completion_tokens_per_s, 1),
        "cache_hit_ratio": round(stats.cache_hit_ratio, 3),
        "digest_reprefills": stats.digest_reprefills,
        "server_hangs": stats.hangs,
        "latency_p50_ms": round(stats.latency_p50_ms, 0),
        "latency_p95_ms": round(stats.latency_p95_ms, 0),
        "max_in_flight": stats.max_in_flight,
        "in_flight_at_start": stats.in_flight_at_start,
        "wall_s": round(stats.wall_s, 1),
        "digest_sha256": outcome.digest_sha256[:12],
        "digest_sha256_full": outcome.digest_sha256,
    }


_SUMMARY_KEYS = (
    ("rows", "rows"),
    ("quarantined", "quarantined"),
    ("generated", "generated"),
    ("from_ledger", "from the ledger"),
    ("completion_tokens_per_s", "tok/s"),
    ("cache_hit_ratio", "cache hit"),
    ("latency_p95_ms", "p95 latency (ms)"),
    ("wall_s", "wall (s)"),
)


def summary_markdown(figures: Mapping[str, object]) -> str:
    """The headline figures of a materialization as a Markdown table."""
    lines = ["| figure | value |", "| --- | --- |"]
    lines += [f"| {label} | {figures[key]} |" for key, label in _SUMMARY_KEYS if key in figures]
    return "\n".join(lines)
