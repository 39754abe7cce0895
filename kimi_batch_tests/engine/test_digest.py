"""Digest fingerprint and the cache-breaker lint."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.engine.digest import SystemDigest, lint_digest, load_digest
from kimi_batch.engine.prompt import assemble_messages
from kimi_batch.llama.messages import ChatMessage
from kimi_batch.settings import default_digest_path


def test_the_shipped_digest_is_clean_and_long() -> None:
    digest = load_digest(default_digest_path())
    assert lint_digest(digest.text) == []
    assert digest.n_bytes > 4000
    assert digest.text.endswith("\n")


def test_line_endings_are_normalized_so_the_sha_is_stable(tmp_path: Path) -> None:
    unix, windows = tmp_path / "unix.md", tmp_path / "windows.md"
    unix.write_bytes(b"Be precise.\nAnswer briefly.\n")
    windows.write_bytes(b"Be precise.\r\nAnswer briefly.\r\n")
    assert load_digest(unix).sha256 == load_digest(windows).sha256


def test_one_byte_changes_the_sha() -> None:
    assert (
        SystemDigest.from_text("Be precise.").sha256 != SystemDigest.from_text("Be precise!").sha256
    )


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("Context as of 2026-11-30 10:00.", "datetime"),
        ("Session 3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b started.", "uuid"),
        ("Build deadbeefcafebabe1234 is current.", "hex id"),
        ("Generated at 1764496800.", "epoch"),
        ("Today is {{today}}.", "placeholder"),
        ("Use the current date when answering.", "placeholder"),
        ("Report dated 2026-11-30.", "date"),
        ("Meeting at 10:30 UTC.", "time"),
    ],
)
def test_lint_rejects_dynamic_content_with_its_line(text: str, rule: str) -> None:
    findings = lint_digest(f"You are a teacher.\n\n{text}\nBe precise.\n")
    assert [(f.line, f.rule) for f in findings] == [(3, rule)]


def test_a_datetime_is_reported_once_not_also_as_date_and_time() -> None:
    findings = lint_digest("line one\nstamp 2026-11-30 10:00\n")
    assert len(findings) == 1
    assert findings[0].line == 2
    assert findings[0].match == "2026-11-30 10:00"


def test_an_allowed_pattern_is_accepted() -> None:
    text = "Schema version 2024-01-01 applies.\n"
    assert lint_digest(text)
    assert lint_digest(text, allow=[r"^2024-01-01$"]) == []


def test_assembly_puts_the_digest_first_and_refuses_a_second_system_message() -> None:
    digest = SystemDigest.from_text("You are a teacher.\n")
    user = ChatMessage(role="user", content="What is 2+2?")
    messages = assemble_messages(digest, [user])
    assert messages[0] == ChatMessage(role="system", content=digest.text)
    assert messages[1:] == [user]
    with pytest.raises(ValueError, match="system"):
        assemble_messages(digest, [ChatMessage(role="system", content="now"), user])
