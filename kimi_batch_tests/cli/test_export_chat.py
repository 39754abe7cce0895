"""`kimi-batch export --format chat|kd`: the conversations the teacher saw, over any partitions."""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

import jinja2
import jinja2.sandbox
import pytest
from gguf import GGUFReader

from kimi_batch.cli.commands import main
from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.engine import SystemDigest, fold_instructions, load_digest
from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.exports import ExportQuery
from kimi_batch.inputs import Landing
from kimi_batch.inputs.landing import LandedVersion
from kimi_batch.inputs.prompts import SeedPrompt, seed_rows
from kimi_batch.inputs.reader import iter_inbox_rows
from kimi_batch.pipeline import DistilledRow
from kimi_batch.settings import Settings, default_model_path
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.batches import chat_line, jsonl, landed_batch
from kimi_batch_tests.support.exports import (
    BATCH_SOURCE,
    DAYS,
    INSTRUCTIONS,
    SOURCES,
    answer_id,
    build_warehouse,
    judge,
)
from kimi_batch_tests.support.rows import CREATED_AT, amplified, distilled


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    return Settings.from_env()


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _export(settings: Settings, fmt: str = "chat", **query: object) -> list[dict[str, object]]:
    path = run_export(settings, ExportRequest(fmt=fmt, query=ExportQuery.model_validate(query)))
    return _lines(path)


def _messages(line: dict[str, object]) -> list[dict[str, str]]:
    messages = line["messages"]
    assert isinstance(messages, list)
    return messages


def test_a_chat_export_is_every_night_s_conversations_as_the_teacher_saw_them(
    settings: Settings,
) -> None:
    build_warehouse(settings)
    lines = _export(settings)
    assert len(lines) == len(DAYS) * len(SOURCES) * 3  # the batch's answers are not in it
    assert all(set(line) == {"messages"} for line in lines)
    digest = load_digest(settings.digest).text
    seed, turns, variant = (_messages(line) for line in lines[:3])
    assert seed[0] == {"role": "system", "content": digest}
    first = f"What is the capital of France (alpha, {DAYS[0]})?"
    assert seed[1] == {"role": "user", "content": fold_instructions(INSTRUCTIONS, first)}
    assert seed[2] == {"role": "assistant", "content": f"Answer 0 for alpha on {DAYS[0]}."}
    assert [m["role"] for m in turns] == ["system", "user", "assistant", "user", "assistant"]
    # A variant was sent as one user turn: the seed's instructions, then the variant's prompt.
    assert variant[1]["content"].startswith(f"<instructions>\n{INSTRUCTIONS}\n</instructions>")
    assert variant[1]["content"].endswith("Name France's capital city (alpha).")


def test_since_until_and_source_choose_the_partitions(settings: Settings) -> None:
    build_warehouse(settings)
    day1, day2 = (date.fromisoformat(day) for day in DAYS)
    assert len(_export(settings, since=day2)) == 6
    assert len(_export(settings, until=day1)) == 6
    assert len(_export(settings, since=day1, until=day1, source="beta")) == 3
    assert len(_export(settings, source="beta")) == 6
    answers = [_messages(line)[-1]["content"] for line in _export(settings, since=day2)]
    assert all(DAYS[1] in answer for answer in answers)
    with pytest.raises(MissingInputError, match="no distilled partition"):
        _export(settings, since=date(2026, 12, 1))
    with pytest.raises(ConfigError, match="after --until"):
        _export(settings, since=day2, until=day1)


def test_a_batch_api_batch_is_exported_only_when_named(settings: Settings) -> None:
    build_warehouse(settings)
    answered = [line for line in _export(settings, "openai-batch") if line["response"]]
    assert len(answered) == len(DAYS) * len(SOURCES) * 3 + 2  # every partition's answers
    with pytest.raises(MissingInputError, match="no Batch API batch"):
        _export(settings, source=BATCH_SOURCE)  # its answers, but no batch of this state dir


def test_a_named_batch_s_answers_are_its_lines_conversations(settings: Settings) -> None:
    system = {"role": "system", "content": "You are terse."}
    lines = [
        chat_line(f"req-{i}", messages=[system, {"role": "user", "content": f"Say {i}."}])
        for i in range(2)
    ]
    batch = landed_batch(settings, jsonl(*lines))
    assert batch.ds is not None
    assert batch.source == batch.id
    digest = SystemDigest.from_text("You are terse.").sha256
    answers = [
        row.model_copy(update={"seed_id": f"req-{i}", "digest_sha256": digest})
        for i, row in enumerate(distilled(amplified(2)))
    ]
    Warehouse(settings.paths.warehouse_dir).write_partition(
        "distilled", batch.ds, batch.id, answers
    )
    assert [_messages(line) for line in _export(settings, source=batch.id)] == [
        [
            system,
            {"role": "user", "content": f"Say {i}."},
            {"role": "assistant", "content": f"answer {i}"},
        ]
        for i in range(2)
    ]


def test_min_judge_score_keeps_the_judged_answers_at_or_above_it(settings: Settings) -> None:
    warehouse = build_warehouse(settings)
    ds = DAYS[1]
    judge(warehouse, ds, "alpha", {answer_id(ds, "alpha", 0): 3, answer_id(ds, "alpha", 1): 8})
    judge(warehouse, ds, "beta", {answer_id(ds, "beta", 2): 9})
    kept = _export(settings, min_judge_score=8)
    # The rest: scored below 8, or never judged (the first night has no judgement at all).
    assert [_messages(line)[-1]["content"] for line in kept] == [
        f"Answer 1 for alpha on {ds}.",
        f"Answer 2 for beta on {ds}.",
    ]
    assert len(_export(settings, min_judge_score=1)) == 3
    with pytest.raises(MissingInputError, match="judge"):
        _export(settings, until=date.fromisoformat(DAYS[0]), min_judge_score=5)
    with pytest.raises(ConfigError, match="training rows"):
        _export(settings, "openai-batch", min_judge_score=5)


def test_kd_lines_carry_the_answer_tokens_ids_and_top_k_logprobs(settings: Settings) -> None:
    build_warehouse(settings)
    lines = _export(settings, "kd", source="alpha")
    assert len(lines) == 6
    first = lines[0]
    assert _messages(first)[-1]["role"] == "assistant"
    assert first["top_k"] == 3
    assert first["completion"] == "Paris is."
    logprobs = first["logprobs"]
    tokenizer = first["tokenizer"]
    assert isinstance(logprobs, dict)
    assert isinstance(tokenizer, dict)
    assert logprobs["content"][0] == {
        "id": 7042,
        "token": "Paris",
        "logprob": -0.25,
        "top_logprobs": [
            {"id": 7042, "token": "Paris", "logprob": -0.25},
            {"id": 40514, "token": "Lyon", "logprob": -2.5},
            {"id": 504, "token": "The", "logprob": -3.0},
        ],
    }
    assert tokenizer["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_kd_without_logprobs_is_a_clear_error_and_writes_nothing(settings: Settings) -> None:
    build_warehouse(settings, logprobs=False)
    out = settings.home / "kd.jsonl"
    with pytest.raises(MissingInputError, match=r"no logprobs.*n_probs"):
        run_export(settings, ExportRequest(fmt="kd", out=out))
    assert not out.exists()
    assert list(out.parent.glob(".kd.jsonl*")) == []


def test_answers_of_another_digest_need_its_file_or_no_system_turn(
    settings: Settings, tmp_path: Path
) -> None:
    old = tmp_path / "old_digest.md"
    old.write_text("You are the old teacher.\n")
    build_warehouse(settings)
    settings = settings.model_copy(update={"digest": old})  # the digest has changed since
    with pytest.raises(ConfigError, match=r"--system FILE.*--no-system"):
        run_export(settings, ExportRequest(fmt="chat"))
    current = Settings.from_env().digest
    path = run_export(settings, ExportRequest(fmt="chat", system_files=(current,)))
    assert _messages(_lines(path)[0])[0]["content"] == load_digest(current).text
    path = run_export(settings, ExportRequest(fmt="chat", no_system=True))
    assert _messages(_lines(path)[0])[0]["role"] == "user"


def _chat_template() -> jinja2.Template:
    model = default_model_path()
    assert model is not None, "the SmolLM2 model is installed by make setup"
    field = GGUFReader(model).fields["tokenizer.chat_template"]
    source = bytes(field.parts[field.data[0]]).decode("utf-8")
    # As transformers renders chat templates: a sandbox, blocks trimmed.
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(source)


def test_chat_lines_render_through_the_model_s_chat_template(settings: Settings) -> None:
    build_warehouse(settings)
    template = _chat_template()
    for line in _export(settings):
        messages = _messages(line)
        rendered = template.render(messages=messages, add_generation_prompt=False)
        position = 0
        for message in messages:
            found = rendered.find(message["content"], position)
            assert found >= position, f"{message['role']} turn missing or out of order"
            position = found + len(message["content"])


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_default_export_is_owner_only(settings: Settings) -> None:
    build_warehouse(settings)
    old = os.umask(0o022)
    try:
        path = run_export(settings, ExportRequest(fmt="chat"))
    finally:
        os.umask(old)
    assert path == settings.home / "exports" / "distilled-all.chat.jsonl"
    assert (_mode(path), _mode(path.parent)) == (0o600, 0o700)


def test_an_interrupted_export_leaves_no_partial_file(settings: Settings) -> None:
    warehouse = build_warehouse(settings)
    out = settings.home / "chosen" / "train.jsonl"
    run_export(settings, ExportRequest(fmt="chat", out=out))
    before = out.read_bytes()
    # The second night's beta seeds are gone: the export fails after three partitions.
    warehouse.write_partition("seeds", DAYS[1], "beta", [])
    with pytest.raises(MissingInputError, match="no seed"):
        run_export(settings, ExportRequest(fmt="chat", out=out))
    assert out.read_bytes() == before
    assert [p.name for p in out.parent.iterdir()] == ["train.jsonl"]


def test_the_command_writes_the_export_and_prints_its_path(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    build_warehouse(settings)
    out = settings.home / "cli.jsonl"
    argv = ["export", "--format", "chat", "--since", DAYS[1], "--source", "alpha"]
    assert main([*argv, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert len(_lines(out)) == 3
    assert main(["export", "--date", DAYS[1], "--since", DAYS[0]]) == 2
    assert "--date is one day" in capsys.readouterr().err


# ---- an answer beside the question it was made from ------------------------------------------


STORY = "story.jsonl"


def _land(settings: Settings, landing: Landing, question: str) -> LandedVersion:
    """The inbox file `story.jsonl` holding `question` (id q1) landed, and the seeds table
    rewritten from it, as the seeds stage does."""
    path = settings.paths.inbox_dir / DAYS[0] / STORY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": "q1", "prompt": question}) + "\n")
    landing.assign_inbox(
        settings.paths.inbox_dir, arrived=date.fromisoformat(DAYS[0]), start=date(2026, 1, 1)
    )
    assignment = landing.assignment(f"{DAYS[0]}/{STORY}")
    assert assignment is not None
    version = landing.land(path, assignment, max_bytes=1 << 20, settle_s=0)
    read = list(iter_inbox_rows(version.path, source_name=version.name))
    seeds = seed_rows(
        [row for row in read if isinstance(row, SeedPrompt)],
        input_sha256=version.sha256,
        created_at=CREATED_AT,
    )
    Warehouse(settings.paths.warehouse_dir).write_partition(
        "seeds", version.ds, version.source, seeds
    )
    return version


def _answered(settings: Settings, version: LandedVersion, text: str) -> None:
    """The distillation of `version`: its one seed answered with `text`."""
    answer = DistilledRow(
        request_id="answer-q1",
        input_id="q1",
        model="smollm2-135m",
        digest_sha256=load_digest(settings.digest).sha256,
        prompt_tokens=30,
        cached_tokens=20,
        completion_tokens=8,
        finish_reason="stop",
        prompt_ms=1.0,
        predicted_ms=2.0,
        latency_ms=3.0,
        endpoint="http://127.0.0.1:8081",
        created_at=CREATED_AT,
        input_sha256=version.sha256,
        seed_id="q1",
        origin="seed",
        strategy=None,
        prompt="What is the capital of France?",
        response=text,
        structured=None,
        logprobs=None,
    )
    Warehouse(settings.paths.warehouse_dir).write_partition(
        "distilled", version.ds, version.source, [answer]
    )


def test_a_re_landed_file_s_old_answer_keeps_its_own_question(settings: Settings) -> None:
    with Landing(settings.paths) as landing:
        v1 = _land(settings, landing, "What is the capital of France?")
        _answered(settings, v1, "Paris is the capital of France.")
        v2 = _land(settings, landing, "What is the capital of Japan?")  # not distilled yet
    assert v2.sha256 != v1.sha256
    [line] = _export(settings, source=v1.source)
    user = [m["content"] for m in _messages(line) if m["role"] == "user"]
    assert user == ["What is the capital of France?"]
    assert _messages(line)[-1]["content"] == "Paris is the capital of France."


def test_an_answer_whose_input_version_is_gone_is_never_paired_with_another(
    settings: Settings,
) -> None:
    with Landing(settings.paths) as landing:
        v1 = _land(settings, landing, "What is the capital of France?")
        _answered(settings, v1, "Paris is the capital of France.")
        _land(settings, landing, "What is the capital of Japan?")
    v1.path.unlink()  # the old snapshot lost
    with pytest.raises(MissingInputError, match=f"input version {v1.sha256[:12]}"):
        _export(settings, source=v1.source)
