"""The fixed system digest: loaded byte-stable, fingerprinted, and linted for cache breakers.

Any byte change in the system prompt invalidates the KV prefix that took ~44 minutes to prefill on
the target, so the text is read as bytes, only line endings are normalized, and dynamic content
(dates, ids, "today") is refused before it ever reaches the server.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import ConfigError, KimiBatchError


class SystemDigest(BaseModel):
    """The digest text with its fingerprint; `text` is exactly what the server receives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(repr=False)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    n_bytes: int = Field(ge=0)
    path: str

    @classmethod
    def from_text(cls, text: str, *, path: str = "<memory>") -> SystemDigest:
        data = text.encode("utf-8")
        return cls(text=text, sha256=hashlib.sha256(data).hexdigest(), n_bytes=len(data), path=path)


# What a raw-prompt completion starts with: nothing (a Batch API completion line's own
# digest is this same empty text, so both key alike).
NO_DIGEST = SystemDigest.from_text("", path="<none>")


def load_digest(path: Path) -> SystemDigest:
    """Read the digest as bytes; CRLF/CR become LF so a checkout on Windows keeps the same sha.
    A file that is not UTF-8 is a `ConfigError` naming it."""
    raw = path.read_bytes()
    try:
        text = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"the digest {path} is not UTF-8 text (byte {error.start}: {error.reason})"
        ) from error
    return SystemDigest.from_text(text, path=str(path))


class LintFinding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    line: int = Field(ge=1)
    rule: str
    match: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule} {self.match!r}"


class DigestLintError(KimiBatchError, ValueError):
    """The digest holds content that would change between runs and break the prefix cache."""

    def __init__(self, path: str, findings: list[LintFinding]) -> None:
        listed = "; ".join(str(finding) for finding in findings)
        super().__init__(
            f"system digest {path} has cache-breaking dynamic content ({listed}). Move it to the "
            "user message, or allow the pattern explicitly."
        )
        self.findings = findings


_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("datetime", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2})?\b")),
    ("date", re.compile(r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:[ap]\.?m\.?|utc|z)?\b", re.I)),
    (
        "uuid",
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
    ),
    ("hex id", re.compile(r"\b[0-9a-f]{16,}\b", re.I)),
    ("epoch", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),
    (
        "placeholder",
        re.compile(
            r"\{\{?\s*(?:today|now|date|time|datetime|timestamp|uuid|request_id)\s*\}?\}"
            r"|\$\{?(?:today|now|date|time|timestamp)\}?|\b(?:today's date|current date|current time)\b",
            re.I,
        ),
    ),
)


def lint_digest(text: str, *, allow: Iterable[str] = ()) -> list[LintFinding]:
    """Cache-breaking content, line by line; matches of an `allow` regex are accepted."""
    allowed = [re.compile(pattern) for pattern in allow]
    findings: list[LintFinding] = []
    for number, line in enumerate(text.split("\n"), start=1):
        covered: list[tuple[int, int]] = []
        for rule, pattern in _RULES:
            for found in pattern.finditer(line):
                span = found.span()
                if any(start <= span[0] and span[1] <= end for start, end in covered):
                    continue  # a datetime is not also reported as a date and a time
                covered.append(span)
                if any(allow_re.search(found.group(0)) for allow_re in allowed):
                    continue
                findings.append(LintFinding(line=number, rule=rule, match=found.group(0)))
    return findings
