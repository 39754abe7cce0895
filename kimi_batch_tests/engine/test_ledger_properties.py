"""Round-trip properties of the engine's ledger (`kimi_batch.engine.ledger`), where a finished row
is kept so that a killed run never repeats or loses it.

Whatever a finished result holds (text with NUL, emoji, combining marks, long text, integers past
64 bits, logprobs and tool calls, optional fields None), once `put` under its request id it reads
back exactly through `get_many`, `iter_results` (in whatever order it is asked, repeats and
missing ids mixed in) and `finished_keys`, after the ledger is closed and opened again, as a
killed run's rerun opens it. An id put twice keeps its first result and one row (first writer
wins), also when put again after reopening.

A result the model accepts but that would not read back as written is refused with a
`KimiBatchError` before anything is written: a lone surrogate (UTF-8 cannot encode it), a NaN or
infinite float (JSON writes null), a UTC offset with seconds (written to the minute). A row put
that way would be skipped by every rerun as finished and then fail, or change, at every read.

SQLite, the embedded default (test_ledger runs its cases on PostgreSQL too). Each example has a
ledger file of its own: an id drawn again by a later example must not meet an earlier one's row.
"""

from __future__ import annotations

import math
import tempfile
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_batch.engine.generation import GenerationResult
from kimi_batch.engine.ledger import Ledger
from kimi_batch.errors import KimiBatchError
from kimi_batch.llama import TokenLogprob, ToolCall, TopLogprob
from kimi_batch_tests.support.results import make_result

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- results ------------------------------------------------------------------------------------

# Scripts, combining marks, emoji, NUL and the other control characters, JSON and SQL syntax.
_ODD = "日本語عربي😀👩‍👩‍👧é\u0301\x00\x01\x07\x1b\x7f\x85\u2028\u200b\ufeff\t\r\n \"'\\{}[]%_?"
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=30)
LONG = st.tuples(TEXT.filter(bool), st.integers(100, 3000)).map(lambda part: part[0] * part[1])
STRINGS = st.one_of(TEXT, LONG)
# Ids that differ by a NUL, a case, a normalization or a space, and a few that repeat.
IDS = st.one_of(st.sampled_from(["a", "A", "a\x00", "a\x00b", "é", "e\u0301", "", " a"]), TEXT)
COUNTS = st.integers(0, 1 << 70)  # JSON holds any integer, past 64 bits too
MILLISECONDS = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
LOGPROBS = st.floats(allow_nan=False, allow_infinity=False)
TOKEN_IDS = st.one_of(st.none(), st.integers(-(1 << 70), 1 << 70))
TOKENS = st.builds(
    TokenLogprob,
    token=TEXT,
    logprob=LOGPROBS,
    top=st.lists(st.builds(TopLogprob, token=TEXT, logprob=LOGPROBS, id=TOKEN_IDS), max_size=3),
    id=TOKEN_IDS,
)


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall.model_validate(
        {"id": call_id, "function": {"name": name, "arguments": arguments}}
    )


CALLS = st.builds(_call, TEXT, TEXT, STRINGS)
# Naive, UTC, or an offset in whole minutes: what an ISO time holds exactly.
_MINUTES = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
TIMES = st.datetimes(timezones=st.one_of(st.none(), st.just(UTC), _MINUTES))


def _optional(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


FIELDS = st.fixed_dictionaries(
    {
        "request_id": IDS,
        "input_id": IDS,
        "tag": TEXT,
        "model": TEXT,
        "digest_sha256": TEXT,
        "text": STRINGS,
        "finish_reason": TEXT,
        "prompt_tokens": COUNTS,
        "cached_tokens": COUNTS,
        "completion_tokens": COUNTS,
        "prompt_ms": MILLISECONDS,
        "predicted_ms": MILLISECONDS,
        "latency_ms": MILLISECONDS,
        "endpoint": TEXT,
        "slot_id": _optional(st.integers(-(1 << 70), 1 << 70)),
        "logprobs": _optional(st.lists(TOKENS, max_size=4)),
        "created_at": TIMES,
        "reasoning_content": _optional(STRINGS),
        "draft_tokens": _optional(COUNTS),
        "draft_accepted_tokens": _optional(COUNTS),
        "tool_calls": _optional(st.lists(CALLS, max_size=2)),
    }
)

# ---- what no ledger row holds -------------------------------------------------------------------

LONE = st.tuples(TEXT, st.characters(categories=["Cs"]), TEXT).map("".join)
NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_SECONDS = st.tuples(st.integers(-23, 23), st.integers(1, 59)).map(
    lambda parts: timezone(timedelta(hours=parts[0], seconds=parts[1]))
)


@st.composite
def _unstorable(draw: st.DrawFn) -> dict[str, Any]:
    """Fields to put over a result's: one value the model accepts that no ledger row holds."""
    text_field = st.sampled_from(["request_id", "input_id", "text", "model", "reasoning_content"])
    spot = draw(st.sampled_from(["text", "milliseconds", "logprob", "top", "time", "call"]))
    if spot == "text":
        return {draw(text_field): draw(LONE)}
    if spot == "milliseconds":  # at least 0: the model refuses NaN there, not infinity
        return {draw(st.sampled_from(["prompt_ms", "predicted_ms", "latency_ms"])): math.inf}
    if spot == "logprob":
        return {"logprobs": [TokenLogprob(token="a", logprob=draw(NOT_FINITE), top=[])]}
    if spot == "top":
        top = TopLogprob(token="b", logprob=draw(NOT_FINITE))
        return {"logprobs": [TokenLogprob(token="a", logprob=-0.5, top=[top])]}
    if spot == "time":
        return {"created_at": draw(st.datetimes(timezones=_SECONDS))}
    return {"tool_calls": [_call("c", draw(LONE), "{}")]}


@st.composite
def _results(draw: st.DrawFn) -> tuple[GenerationResult, bool]:
    """A result and whether the ledger must keep it (else it must refuse it)."""
    fields: dict[str, Any] = draw(FIELDS)
    storable = draw(st.integers(0, 4)) != 0
    if not storable:
        fields.update(draw(_unstorable()))
    return make_result(**fields), storable


# ---- checks -------------------------------------------------------------------------------------


def _same(got: GenerationResult, written: GenerationResult) -> None:
    """Equal field for field, and in the same JSON (so -0.0 is not 0.0 and an offset is kept)."""
    assert got == written
    assert got.model_dump_json() == written.model_dump_json()


def _check_reads(ledger: Ledger, kept: dict[str, GenerationResult], asked: list[str]) -> None:
    """Every read API answers `asked` with the kept results, exactly, and nothing else."""
    found = ledger.get_many(asked)
    assert sorted(found) == sorted(set(asked) & set(kept))
    for request_id, result in found.items():
        _same(result, kept[request_id])
    for chunk_size in (1, 3, 256):
        streamed = list(ledger.iter_results(asked, chunk_size=chunk_size))
        expected = [kept[request_id] for request_id in asked if request_id in kept]
        assert len(streamed) == len(expected)
        for got, written in zip(streamed, expected, strict=True):
            _same(got, written)
    assert ledger.finished_keys(asked) == set(asked) & set(kept)
    assert ledger.count() == len(kept)


def _encodable(text: str) -> bool:
    """Whether a read may ask for this id (a lone surrogate can be no row's key)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _ledger_file(tmp_path: Path) -> Path:
    """A ledger file of the example's own, under the test's folder."""
    return Path(tempfile.mkdtemp(dir=tmp_path)) / "ledger.sqlite3"


# ---- 1. put, reopened, read back exactly ---------------------------------------------------------


def test_results_read_back_exactly_after_reopening_and_an_id_is_kept_once(tmp_path: Path) -> None:
    @EXAMPLES
    @given(puts=st.lists(_results(), max_size=8), data=st.data())
    def read_back(puts: list[tuple[GenerationResult, bool]], data: st.DataObject) -> None:
        where = _ledger_file(tmp_path)
        kept: dict[str, GenerationResult] = {}
        with Ledger(where) as ledger:
            for result, storable in puts:
                request_id = result.request_id
                if storable:
                    assert ledger.put(result) is (request_id not in kept)  # first writer wins
                    kept.setdefault(request_id, result)
                else:
                    with pytest.raises(KimiBatchError):
                        ledger.put(result)
                # Nothing half-written: no row for a refused result, one row for a repeated id.
                assert ledger.count() == len(kept)
                if _encodable(request_id):
                    assert ledger.finished_keys([request_id]) == {request_id} & set(kept)

        # Asked in any order, with repeats, missing ids and more than a query's 500 at times.
        missing = data.draw(st.lists(IDS, max_size=4), label="missing")
        many = data.draw(st.sampled_from([0, 0, 0, 499, 501]), label="many missing")
        missing += [f"\x01missing {n}" for n in range(many)]
        ids = [*kept, *(i for i in missing if i not in kept)]
        repeats = data.draw(st.lists(st.sampled_from(ids), max_size=4) if ids else st.just([]))
        asked = data.draw(st.permutations(ids + repeats), label="asked")
        with Ledger(where) as ledger:  # as the rerun of a killed run opens it
            _check_reads(ledger, kept, asked)
            for result in kept.values():  # put again, by the rerun: the first result stays
                assert ledger.put(result.model_copy(update={"text": result.text + "!"})) is False
            _check_reads(ledger, kept, asked)

    read_back()


# ---- 2. the defects behind the property above, one example each ---------------------------------
# Before the fix in `ledger.put` the lone surrogate raised pydantic's PydanticSerializationError
# (no KimiBatchError); the infinite time and the NaN logprob were stored as null, so the row
# counted as finished for every rerun and every read of it raised pydantic's ValidationError;
# the offset with seconds was stored to the minute, read back as another time.


def _refused_and_nothing_written(tmp_path: Path, bad: GenerationResult) -> None:
    good = make_result(request_id="good")
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        assert ledger.put(good)
        with pytest.raises(KimiBatchError, match=r"^ledger: the result of request 'bad'"):
            ledger.put(bad)
        assert ledger.count() == 1
        assert ledger.finished_keys(["good", "bad"]) == {"good"}
        assert ledger.get_many(["good", "bad"]) == {"good": good}


def test_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    _refused_and_nothing_written(tmp_path, make_result("an\ud800swer", request_id="bad"))


def test_an_infinite_time_is_refused_not_stored_unreadable(tmp_path: Path) -> None:
    _refused_and_nothing_written(tmp_path, make_result(request_id="bad", prompt_ms=math.inf))


def test_a_nan_logprob_is_refused_not_stored_unreadable(tmp_path: Path) -> None:
    token = TokenLogprob(token="a", logprob=math.nan, top=[])
    _refused_and_nothing_written(tmp_path, make_result(request_id="bad", logprobs=[token]))


def test_a_utc_offset_with_seconds_is_refused_not_stored_as_another_time(tmp_path: Path) -> None:
    at = datetime(2025, 1, 1, tzinfo=timezone(timedelta(seconds=37)))
    _refused_and_nothing_written(tmp_path, make_result(request_id="bad", created_at=at))
