"""The `hf` export's dataset card, read back as the Hub reads it (`huggingface_hub`)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from huggingface_hub import DatasetCard

from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.exports import CardOptions, ExportQuery, ScriptCounter, TokenStats, reason_name
from kimi_batch.exports.card import _size_category
from kimi_batch.settings import Settings
from kimi_batch.warehouse import Warehouse
from kimi_batch_tests.support.exports import DAYS, QUARANTINE_REASONS, SOURCES, build_warehouse


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return Settings.from_env()


def _card(settings: Settings, card: CardOptions | None = None) -> DatasetCard:
    request = ExportRequest(fmt="hf", query=ExportQuery(), card=card or CardOptions())
    folder = run_export(settings, request)
    return DatasetCard.load(folder / "README.md")


def test_the_card_parses_and_declares_license_language_name_and_how_it_was_made(
    settings: Settings,
) -> None:
    warehouse: Warehouse = build_warehouse(settings)
    card = _card(settings)
    data = card.data.to_dict()
    assert data["license"] == "other"
    assert data["language"] == ["en"]
    assert data["pretty_name"] == "Distilled answers of smollm2-135m"
    assert data["task_categories"] == ["text-generation"]
    assert data["size_categories"] == ["n<1K"]
    made = data["kimi_batch"]
    # The snapshot each table was read at: what `export --as-of` reads back.
    snapshots = made["table_snapshot_ids"]
    assert snapshots["distilled"] == warehouse.snapshot_id("distilled")
    assert set(snapshots) >= {"distilled", "quarantine"}
    partitions = len(DAYS) * len(SOURCES)
    assert [(s["ds"], s["source"]) for s in made["sources"]] == [
        (ds, source) for ds in DAYS for source in SOURCES
    ]
    # Each source names the sha256 of the input versions its rows were built from.
    for source in made["sources"]:
        rows = warehouse.read_partition("distilled", source["ds"], source["source"])
        assert source["input_sha256"] == sorted(set(rows["input_sha256"].to_list()))
        assert len(source["input_sha256"][0]) == 64
    assert made["quarantine"] == {
        "duplicate": partitions,
        "near_duplicate": 2 * partitions,
        "contaminated": partitions,
        "answer cut off at max_tokens": partitions,
    }
    assert set(made["sampling"]) == {"max_tokens", "temperature", "top_p", "seed"}
    assert made["top_k_logprobs"] == 3
    assert "the teacher model's license" in card.text
    assert "Guessed from the rows' letters by script" in card.text
    assert f"| distilled | {snapshots['distilled']} |" in card.text


def test_the_card_declares_what_the_user_configured(settings: Settings) -> None:
    build_warehouse(settings)
    options = CardOptions(license="apache-2.0", language=("fr", "de"), pretty_name="Mes réponses")
    data = _card(settings, options).data.to_dict()
    assert (data["license"], data["language"], data["pretty_name"]) == (
        "apache-2.0",
        ["fr", "de"],
        "Mes réponses",
    )
    text = _card(settings, options).text
    assert "the teacher model's license" not in text
    assert "Guessed from the rows' letters" not in text


def test_quarantine_reasons_count_under_their_full_names() -> None:
    assert [reason_name(reason) for reason in QUARANTINE_REASONS] == [
        "duplicate",
        "near_duplicate",
        "near_duplicate",
        "contaminated",
        "answer cut off at max_tokens",
    ]
    assert reason_name("empty answer: not a final answer") == "empty answer"
    assert reason_name("prompt is 912 tokens, over the limit of 512") == (
        "prompt is N tokens, over the limit of N"
    )
    assert reason_name("duplicate input id 'a-1' (first on line 3)") == "duplicate input id …"
    assert reason_name("invalid JSON: Expecting value (column 3)") == "invalid JSON"
    assert TokenStats.of([1, 2, 3, 4, 100]) == TokenStats(
        count=5, mean=22.0, p50=3, p95=100, max=100
    )


@pytest.mark.parametrize(
    ("texts", "languages"),
    [
        (["What is the capital of France?", "Paris."], ["en"]),
        (["Какая столица Франции?", "Париж."], ["ru"]),
        (["法国的首都是巴黎吗", "巴黎。"], ["zh"]),
        (["フランスの首都はどこですか。", "パリです。"], ["ja"]),
        (["Which is 北京 in pinyin?", "It is Beijing, written Běijīng."], ["en"]),
        (["1 + 1 = 2", "∑"], []),
    ],
)
def test_languages_are_guessed_by_script(texts: list[str], languages: list[str]) -> None:
    counter = ScriptCounter()
    counter.add(texts)
    assert counter.languages() == languages


@pytest.mark.parametrize(
    ("rows", "category"),
    [(999, "n<1K"), (1_000, "1K<n<10K"), (999_999, "100K<n<1M"), (1_000_000, "1M<n<10M"),
     (123_456_789, "100M<n<1B"), (10**12, "n>1T")],
)  # fmt: skip
def test_the_size_category_is_one_the_hub_knows(rows: int, category: str) -> None:
    known = json.loads(
        (Path(datasets.__file__).parent / "utils/resources/size_categories.json").read_text()
    )
    assert _size_category(rows) == category
    assert category in known


def test_card_options_are_checked_against_the_hub_s_ids() -> None:
    """The license ids of the Hub's list and its language codes pass (in the Hub's lower-case
    spelling: ISO 639-1, three-letter ISO 639-2/3, `code`); anything else is a ConfigError
    naming the option and the value."""
    from kimi_batch.errors import ConfigError

    assert CardOptions().check() == CardOptions()
    checked = CardOptions(license="Apache-2.0", language=("EN", "ja")).check()
    assert (checked.license, checked.language) == ("apache-2.0", ("en", "ja"))
    for code in ("llama3.1", "cc-by-nc-sa-4.0", "openrail++", "unknown"):
        assert CardOptions(license=code).check().license == code
    # Every language the script guess can declare is one the check lets through.
    counter = ScriptCounter()
    counter.add(["Hello Привет Γειά שלום مرحبا नमस्ते สวัสดี 안녕 你好"])
    guessed = tuple(counter.languages())
    assert len(guessed) > 5
    assert CardOptions(language=guessed).check().language == guessed
    with pytest.raises(ConfigError, match=r"^--license 'apache' is not a license id"):
        CardOptions(license="apache").check()
    # Languages of the Hub beyond ISO 639-1: Cantonese, Filipino, Cebuano, and code.
    hub_only = ("yue", "FIL", "ceb", "code")
    assert CardOptions(language=hub_only).check().language == ("yue", "fil", "ceb", "code")
    for refused in ("en-US", "english", "xx", "e1"):
        with pytest.raises(ConfigError, match=rf"^--language '{refused}' is not a language code"):
            CardOptions(language=("fr", refused)).check()


def test_the_iso_639_1_codes_are_the_hub_s_two_letter_languages() -> None:
    """The list `--language` is checked against, against the Hub's own list of languages as
    the `datasets` package ships it."""
    from kimi_batch.exports.language import ISO_639_1

    known = json.loads(
        (Path(datasets.__file__).parent / "utils/resources/languages.json").read_text()
    )
    assert {code for code in known if len(code) == 2} == ISO_639_1
