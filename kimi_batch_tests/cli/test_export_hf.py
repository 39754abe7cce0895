"""`kimi-batch export --format hf`: a folder the real `datasets` loads, with its dataset card."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.engine import load_digest
from kimi_batch.errors import ConfigError, MissingInputError
from kimi_batch.exports import ExportQuery, push_to_hub
from kimi_batch.settings import Settings
from kimi_batch_tests.support.exports import (
    DAYS,
    SOURCES,
    answer_id,
    build_warehouse,
    judge,
)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return Settings.from_env()


def _hf(settings: Settings, out: Path | None = None, **query: object) -> Path:
    request = ExportRequest(fmt="hf", out=out, query=ExportQuery.model_validate(query))
    return run_export(settings, request)


def test_datasets_loads_the_hf_export_and_its_card_says_how_it_was_made(
    settings: Settings, tmp_path: Path
) -> None:
    import datasets

    warehouse = build_warehouse(settings)
    ds = DAYS[1]
    judge(warehouse, ds, "alpha", {answer_id(ds, "alpha", 1): 7})
    folder = _hf(settings)
    loaded = datasets.load_dataset("parquet", data_dir=str(folder), cache_dir=str(tmp_path / "c"))
    train = loaded["train"]  # pyright: ignore[reportIndexIssue]
    assert train.num_rows == len(DAYS) * len(SOURCES) * 3
    assert {"messages", "request_id", "model", "completion_tokens", "judge_score"} <= set(
        train.column_names
    )
    first = train[0]
    assert [turn["role"] for turn in first["messages"]] == ["system", "user", "assistant"]
    assert sorted(score for score in train["judge_score"] if score is not None) == [7]
    # The card's YAML header is what load_dataset(folder) reads: the same rows.
    by_card = datasets.load_dataset(str(folder), cache_dir=str(tmp_path / "c2"))
    assert by_card["train"].num_rows == train.num_rows  # pyright: ignore[reportIndexIssue]

    card = (folder / "README.md").read_text()
    assert card.startswith("---\n")
    assert load_digest(settings.digest).sha256 in card
    partitions = len(DAYS) * len(SOURCES)
    assert f"| duplicate | {partitions} |" in card
    assert f"| near_duplicate | {2 * partitions} |" in card
    assert f"| contaminated | {partitions} |" in card
    assert f"| answer cut off at max_tokens | {partitions} |" in card
    assert "smollm2-135m" in card
    assert "- Judge scores (score: rows): 7: 1" in card
    assert "| near-duplicate threshold (MinHash Jaccard) | 0.8 |" in card
    assert "| prompt | 12 | 110.0 | 110 | 120 | 120 |" in card
    assert "distillation run config's defaults" in card
    assert f"| {DAYS[0]} | alpha |" in card


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_hf_folder_is_owner_only_and_replaced_whole(settings: Settings) -> None:
    warehouse = build_warehouse(settings)
    old = os.umask(0o022)
    try:
        folder = _hf(settings, source="alpha")
    finally:
        os.umask(old)
    assert folder == settings.home / "exports" / "distilled-all-alpha.hf"
    files = [path for path in folder.rglob("*") if path.is_file()]
    assert sorted(path.name for path in files) == [
        "README.md",
        "train-00000.parquet",
        "train-00001.parquet",
    ]
    assert {_mode(path) for path in files} == {0o600}
    assert {_mode(folder), _mode(folder / "data")} == {0o700}
    card = (folder / "README.md").read_bytes()
    # A failing export (a partition's seeds are gone) leaves the earlier one as it was.
    warehouse.write_partition("seeds", DAYS[1], "alpha", [])
    with pytest.raises(MissingInputError):
        _hf(settings, source="alpha")
    assert (folder / "README.md").read_bytes() == card
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]


def test_a_killed_export_s_temp_folder_is_removed_by_the_next(settings: Settings) -> None:
    build_warehouse(settings)
    out = settings.home / "exports" / "night.hf"
    stale = out.parent / f".night.hf.{(1 << 22) + 7}-{'0' * 32}.tmp"  # no such pid
    (stale / "data").mkdir(parents=True)
    (stale / "data" / "train-00000.parquet").write_bytes(b"half")
    _hf(settings, out=out)
    assert sorted(path.name for path in out.parent.iterdir()) == ["night.hf"]


def test_an_hf_export_never_replaces_a_folder_it_did_not_write(
    settings: Settings, tmp_path: Path
) -> None:
    build_warehouse(settings)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not an earlier hf export"):
        _hf(settings, out=mine)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_the_card_options_on_the_command_line_reach_the_card(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import DatasetCard

    from kimi_batch.cli.commands import main

    build_warehouse(settings)
    out = settings.home / "exports" / "named.hf"
    argv = ["export", "--format", "hf", "--out", str(out), "--license", "mit"]
    argv += ["--language", "fr", "--language", "en", "--pretty-name", "Réponses"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = DatasetCard.load(out / "README.md").data.to_dict()
    assert (data["license"], data["language"], data["pretty_name"]) == (
        "mit",
        ["fr", "en"],
        "Réponses",
    )
    # Pushing is for a folder: a file format refuses it before reading anything.
    assert main(["export", "--format", "chat", "--push-to-hub", "me/data"]) == 2
    assert "--push-to-hub" in capsys.readouterr().err


def test_a_push_replaces_what_an_earlier_export_left_on_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-pushed with fewer partitions, the old data files would stay and the card's `data/*`
    load them again. No Hub here: the upload's arguments, matched by the Hub client's own
    pattern filter against what a repository may hold."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    uploads: list[dict[str, object]] = []

    class _Hub:
        def create_repo(self, *args: object, **kwargs: object) -> None:
            return None

        def upload_folder(self, **kwargs: object) -> object:
            uploads.append(kwargs)
            return type("Commit", (), {"commit_url": "https://hub/commit"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", _Hub)
    assert push_to_hub(tmp_path, "me/data") == "https://hub/commit"
    [upload] = uploads
    patterns = upload["delete_patterns"]
    assert isinstance(patterns, list)
    remote = [
        "data/train-00009-of-00010.parquet",
        "system.json",
        "README.md",
        "LICENSE",
        "notes/eval.md",
    ]
    deleted = set(filter_repo_objects(remote, allow_patterns=patterns))
    assert deleted == {"data/train-00009-of-00010.parquet", "system.json"}


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--license", "apache", "--license 'apache' is not a license id the Hugging Face Hub"),
        ("--license", "GPL-2.0-or-later", "--license 'GPL-2.0-or-later' is not a license id"),
        ("--language", "english", "--language 'english' is not a language code the Hub knows"),
        ("--language", "en-US", "--language 'en-US' is not a language code the Hub knows"),
        ("--language", "xx", "--language 'xx' is not a language code the Hub knows"),
    ],
)
def test_a_card_value_the_hub_would_refuse_is_one_line_before_any_work(
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: str,
    value: str,
    says: str,
) -> None:
    """It was written into the card as given: the Hub refused the card (or filed the dataset
    under no language) only at `--push-to-hub`, after the whole export, or never said a word."""
    from kimi_batch.cli import export
    from kimi_batch.cli.commands import main

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warehouse was opened before the options were checked")

    monkeypatch.setattr(export, "open_warehouse", no_work)
    out = settings.home / "exports" / "refused.hf"
    assert main(["export", "--format", "hf", "--out", str(out), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kimi-batch: error: {says}"), err
    assert err.count("\n") == 1
    assert not out.exists()


def test_card_ids_are_taken_in_the_hub_s_spelling(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import DatasetCard

    from kimi_batch.cli.commands import main

    build_warehouse(settings)
    out = settings.home / "exports" / "spelled.hf"
    argv = ["export", "--format", "hf", "--out", str(out), "--license", "CC-BY-4.0"]
    assert main([*argv, "--language", "FR", "--language", "zh"]) == 0
    capsys.readouterr()
    data = DatasetCard.load(out / "README.md").data.to_dict()
    assert (data["license"], data["language"]) == ("cc-by-4.0", ["fr", "zh"])
