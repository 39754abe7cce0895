"""The nightly schedule evaluated at given nights on a real temporary instance."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import BinaryIO
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from kimi_batch.defs import schedules
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, NIGHTLY_OP_NAME
from kimi_batch.inputs import partition_input
from kimi_batch.inputs.landing import Landing
from kimi_batch.quality import IndexedText, QualityGate
from kimi_batch.settings import Settings
from kimi_batch_tests.support.repo import REPO_ROOT
from kimi_batch_tests.support.standins import standin_definitions

pytestmark = [
    pytest.mark.filterwarnings("ignore:Non-compliant tag keys:DeprecationWarning"),
    pytest.mark.no_llama_server,
]

NIGHT = datetime(2025, 6, 2, 2, 0, tzinfo=UTC)  # the night after June 1
SCHEDULE = "nightly_distillation_schedule"


def put(path: Path, *, mtime: datetime | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"prompt": "hi"}\n')
    if mtime is not None:
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    path = tmp_path / "inbox"
    put(path / "2025-06-01" / "alpha.jsonl")
    put(path / "2025-06-01" / "beta.jsonl")
    put(path / "late_upload.jsonl", mtime=datetime(2025, 6, 1, 23, 59, tzinfo=UTC))
    # Not June 1: the day before, the day after, a root file from June 2.
    put(path / "2025-05-31" / "old.jsonl")
    put(path / "2025-06-02" / "next.jsonl")
    put(path / "early.jsonl", mtime=datetime(2025, 6, 2, 0, 1, tzinfo=UTC))
    return path


def evaluate(
    instance: dg.DagsterInstance, when: datetime
) -> tuple[list[dg.RunRequest], str | None]:
    defs = standin_definitions()
    # Closed on the way out: the context's own instance (from the ref) must not outlive the test's.
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        repository_def=defs.get_repository_def(),
    ) as context:
        data = defs.resolve_schedule_def(SCHEDULE).evaluate_tick(context)
    return list(data.run_requests or []), data.skip_message


def mpk(source: str, ds: str = "2025-06-01") -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"date": ds, "source": source})


def night_keys(requests: list[dg.RunRequest]) -> list[str]:
    """The partitions of the night's one run (its run config), in order."""
    (request,) = requests
    assert request.job_name == NIGHTLY_JOB_NAME
    return request.run_config["ops"][NIGHTLY_OP_NAME]["config"]["partitions"]


def test_night_asks_for_every_partition_not_yet_distilled_oldest_first(inbox: Path) -> None:
    with dg.instance_for_test() as instance:
        requests, skip = evaluate(instance, NIGHT)
        sources = instance.get_dynamic_partitions("source")

    assert skip is None
    # Undated files nobody had seen are assigned to the night that just ended (June 1), whatever
    # their mtime; the June 2 folder waits for its own night; May 31 was never distilled. The
    # night is one run over all of them.
    assert night_keys(requests) == [
        str(mpk("old", "2025-05-31")),
        str(mpk("alpha")),
        str(mpk("beta")),
        str(mpk("early")),
        str(mpk("late_upload")),
    ]
    (request,) = requests
    assert request.run_key == "nightly:2025-06-01"
    assert request.tags["kimi_batch/night"] == "2025-06-01"
    assert request.tags[schedules.TRIGGER_TAG] == "nightly"
    assert request.tags[schedules.PARTITIONS_TAG] == "5"
    assert request.tags["dagster/max_retries"] == "2"
    assert {"alpha", "beta", "late_upload", "old", "early"} <= set(sources)


def test_re_evaluating_a_night_gives_the_same_run_keys(inbox: Path) -> None:
    with dg.instance_for_test() as instance:
        first, _ = evaluate(instance, NIGHT)
        second, _ = evaluate(instance, NIGHT)

    assert [r.run_key for r in first] == [r.run_key for r in second]


def test_a_lost_night_is_caught_up_the_next_night(inbox: Path) -> None:
    defs = standin_definitions()
    with dg.instance_for_test() as instance:
        first, _ = evaluate(instance, NIGHT)
        # That night only alpha finished; the rest failed or was stopped at the window.
        distill(defs, instance, mpk("alpha"))
        (inbox / "2025-06-01" / "beta.jsonl").unlink()  # cleaned up: its partition stays known
        next_night, _ = evaluate(instance, datetime(2025, 6, 3, 2, 0, tzinfo=UTC))

    assert len(night_keys(first)) == 5
    assert night_keys(next_night) == [
        str(mpk("old", "2025-05-31")),
        str(mpk("beta")),
        str(mpk("early")),
        str(mpk("late_upload")),
        str(mpk("next", "2025-06-02")),
    ]
    assert next_night[0].run_key == "nightly:2025-06-02"  # not deduped by night 1


def test_everything_distilled_is_a_skip(inbox: Path) -> None:
    defs = standin_definitions()
    with dg.instance_for_test() as instance:
        for key in night_keys(evaluate(instance, NIGHT)[0]):
            distill(defs, instance, key)
        requests, skip = evaluate(instance, NIGHT)
        # The idle night is an update to Dagster's freshness check, not a missed night.
        (observed,) = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("distilled_responses")), limit=5
        ).records

    assert observed.asset_observation is not None
    assert "dagster/last_updated_timestamp" in observed.asset_observation.metadata
    assert requests == []
    # The fixture's files were written just now: still changing, named for the next tick.
    assert skip is not None
    assert skip.startswith("every partition up to 2025-06-01 is distilled")


def test_the_window_end_and_a_matching_max_runtime_ride_on_every_run(
    inbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_NIGHT_ENDS", "07:00")
    with dg.instance_for_test() as instance:
        requests, _ = evaluate(instance, NIGHT)

    assert {r.tags[schedules.WINDOW_TAG] for r in requests} == {"2025-06-02T07:00:00+00:00"}
    expected = 5 * 3600 + schedules.WINDOW_GRACE_S
    assert {r.tags[schedules.MAX_RUNTIME_TAG] for r in requests} == {str(expected)}


@pytest.mark.parametrize(
    ("night", "window_h"), [("2025-10-25", 7), ("2025-03-29", 5), ("2025-06-01", 6)]
)
def test_the_max_runtime_is_the_window_s_real_length_across_a_clock_change(
    night: str, window_h: int
) -> None:
    """From 01:00 to 07:00 in Paris: 7 real hours the night the clocks go back, 5 the night
    they go forward (times of one zone subtract as wall-clock times)."""
    paris = ZoneInfo("Europe/Paris")
    started = datetime.combine(date.fromisoformat(night) + timedelta(days=1), time(1), paris)
    end = started.replace(hour=7)
    tags = schedules.nightly_tags(night, end, started)
    assert tags[schedules.MAX_RUNTIME_TAG] == str(window_h * 3600 + schedules.WINDOW_GRACE_S)


def distill(
    defs: dg.Definitions, instance: dg.DagsterInstance, partition: str | dg.MultiPartitionKey
) -> None:
    result = dg.materialize(
        [defs.get_assets_def("distilled_responses")],
        partition_key=str(partition),
        instance=instance,
    )
    assert result.success


def test_job_is_the_nightly_job_over_many_partitions_with_the_llama_tag() -> None:
    from kimi_batch.defs.assets.night import nightly_job

    defs = standin_definitions()
    nightly_distillation_schedule = defs.resolve_schedule_def(SCHEDULE)

    assert nightly_distillation_schedule.job_name == NIGHTLY_JOB_NAME == nightly_job.name
    # Unpartitioned: its partitions are its run config; one llama run at a time in the queue.
    assert nightly_job.partitions_def is None
    assert nightly_job.tags["kimi_batch/uses_llama_server"] == "true"
    assert [node.name for node in nightly_job.nodes] == [NIGHTLY_OP_NAME]


def _schedule_settings(env: dict[str, str]) -> dict[str, str]:
    """cron, timezone and default status of the schedule as a fresh process loads it."""
    code = (
        "import json; from kimi_batch.definitions import build_definitions; "
        "from kimi_batch.settings import Settings; "
        "s = build_definitions(Settings.from_env()).resolve_schedule_def("
        "'nightly_distillation_schedule'); "
        "print(json.dumps({'cron': s.cron_schedule, 'tz': s.execution_timezone, "
        "'status': s.default_status.value}))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_BATCH_NIGHTLY")}
    clean.pop("KIMI_BATCH_TIMEZONE", None)
    output = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


@pytest.mark.slow
def test_cron_timezone_and_status_come_from_the_environment() -> None:
    assert _schedule_settings({}) == {"cron": "0 2 * * *", "tz": "UTC", "status": "STOPPED"}
    assert _schedule_settings(
        {
            "KIMI_BATCH_NIGHTLY_CRON": "30 3 * * 1-5",
            "KIMI_BATCH_TIMEZONE": "Europe/Berlin",
            "KIMI_BATCH_NIGHTLY_STATUS": "running",
        }
    ) == {"cron": "30 3 * * 1-5", "tz": "Europe/Berlin", "status": "RUNNING"}


@pytest.mark.slow
def test_bad_timezone_fails_loudly() -> None:
    with pytest.raises(subprocess.CalledProcessError) as caught:
        _schedule_settings({"KIMI_BATCH_TIMEZONE": "Mars/Olympus"})
    assert "KIMI_BATCH_TIMEZONE" in caught.value.stderr


def _settled(path: Path, text: str, age_s: float) -> str:
    """Write `text` to `path` with an mtime `age_s` ago (settled); its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    past = datetime.now(UTC).timestamp() - age_s
    os.utime(path, (past, past))
    return hashlib.sha256(text.encode()).hexdigest()


def _current(ds: str, source: str) -> str | None:
    with Landing(Settings.from_env().paths) as landing:
        version = landing.current(ds, source)
    return version.sha256 if version else None


def test_with_the_sensor_stopped_the_night_lands_rewrites_and_reverts_and_asks_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    path = tmp_path / "inbox" / "2025-06-01" / "story.jsonl"
    defs = standin_definitions()
    partition = str(mpk("story"))
    with dg.instance_for_test() as instance:
        sha_a = _settled(path, '{"prompt": "A"}\n', age_s=300)
        night_1 = night_keys(evaluate(instance, NIGHT)[0])
        distill(defs, instance, partition)  # records the version the night landed
        unchanged, skip = evaluate(instance, datetime(2025, 6, 3, 2, 0, tzinfo=UTC))
        sha_b = _settled(path, '{"prompt": "B"}\n', age_s=200)  # rewritten, same name
        night_2 = night_keys(evaluate(instance, datetime(2025, 6, 3, 2, 0, tzinfo=UTC))[0])
        landed_b = _current("2025-06-01", "story")
        distill(defs, instance, partition)
        _settled(path, '{"prompt": "A"}\n', age_s=100)  # and back: A -> B -> A
        night_3 = night_keys(evaluate(instance, datetime(2025, 6, 4, 2, 0, tzinfo=UTC))[0])
        landed_a = _current("2025-06-01", "story")

    assert night_1 == [partition]
    assert unchanged == []
    assert skip == "every partition up to 2025-06-02 is distilled"
    assert (night_2, landed_b) == ([partition], sha_b)
    # A landed again as the newest version: the distillation (of B) is stale.
    assert (night_3, landed_a) == ([partition], sha_a)


def test_a_file_still_changing_is_named_and_landed_by_the_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    path = tmp_path / "inbox" / "2025-06-01" / "story.jsonl"
    defs = standin_definitions()
    with dg.instance_for_test() as instance:
        sha_a = _settled(path, '{"prompt": "A"}\n', age_s=300)
        evaluate(instance, NIGHT)
        distill(defs, instance, mpk("story"))
        path.write_text('{"prompt": "B, still being copied"}\n')  # mtime now: still changing
        busy, skip = evaluate(instance, NIGHT)
        still_a = _current("2025-06-01", "story")
        past = datetime.now(UTC).timestamp() - 60
        os.utime(path, (past, past))
        settled, _ = evaluate(instance, NIGHT)

    assert busy == []
    assert skip is not None
    assert "still changing" in skip
    assert "2025-06-01/story.jsonl" in skip
    assert still_a == sha_a
    assert night_keys(settled) == [str(mpk("story"))]


def test_partitions_holding_repeats_of_a_row_that_left_are_asked_for_again(inbox: Path) -> None:
    """Every file asks "hi": the first screened keeps it, the others set it aside as a repeat.
    When that partition is rebuilt without the row, the night lands the others again."""
    defs = standin_definitions()
    settings = Settings.from_env()
    index = QualityGate(settings, settings.paths.dedup_state).index  # as the real landing's
    with dg.instance_for_test() as instance:
        for key in night_keys(evaluate(instance, NIGHT)[0]):
            distill(defs, instance, key)
            ds, source = str(key).split("|")
            with index.partition(ds, source) as screen:
                screen.check(IndexedText(request_id=f"{source}-1", input_id="1", text="hi"))
        assert evaluate(instance, NIGHT)[0] == []
        with index.partition("2025-05-31", "old"):
            pass  # rebuilt, its input now without "hi"
        requests, _ = evaluate(instance, NIGHT)
    assert night_keys(requests) == [
        str(mpk("alpha")),
        str(mpk("beta")),
        str(mpk("early")),
        str(mpk("late_upload")),
    ]


def test_a_second_tick_over_an_unchanged_inbox_hashes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    inbox = tmp_path / "inbox" / "2025-06-01"
    names: dict[str, str] = {}
    for name in ("a", "b", "c", "B"):
        content = f'{{"prompt": "{name}"}}\n'
        names[hashlib.sha256(content.encode()).hexdigest()] = f"{name.lower()}.jsonl"
        if name != "B":
            _settled(inbox / f"{name}.jsonl", content, age_s=300)
    hashed: list[str] = []
    real = partition_input.sha256_of

    def counted(handle: BinaryIO) -> str:
        digest = real(handle)
        hashed.append(names[digest])  # the file read, known by its content
        return digest

    monkeypatch.setattr(partition_input, "sha256_of", counted)
    with dg.instance_for_test() as instance:
        first = night_keys(evaluate(instance, NIGHT)[0])
        assert sorted(hashed) == ["a.jsonl", "b.jsonl", "c.jsonl"]
        hashed.clear()
        second = night_keys(evaluate(instance, NIGHT)[0])
        assert hashed == []  # every file's stat matched its last hash: none read again
        _settled(inbox / "b.jsonl", '{"prompt": "B"}\n', age_s=100)  # a rewrite is still seen
        evaluate(instance, NIGHT)
    assert first == second == [str(mpk(name)) for name in ("a", "b", "c")]
    assert hashed == ["b.jsonl"]
    assert _current("2025-06-01", "b") == hashlib.sha256(b'{"prompt": "B"}\n').hexdigest()
