"""Round-trip properties of the warehouse's tables: a row written to a partition reads back as it
was written (text with NUL, emoji and combining marks, long strings, edge numbers, nulls, empty
lists), replacing a partition leaves every other partition as it was, and a partition key is
either accepted and round-trips through `ds|source` or refused with `InvalidPartitionError`.

Rows are drawn field by field from each table's row model (`TABLES`), so a table added later is
covered too. A drawn row the model refuses (`ValidationError`) is simply not written; a null
list of structs reads back empty (pyiceberg's, pinned in test_tables). A row the model accepts
but no column can hold (an integer past 64 bits, a lone surrogate, a zoned time UTC cannot
hold) is a `StorageError` naming the row, and the partition keeps its rows.

A write is a catalog commit: each test opens one warehouse and runs its few examples on it (a
partition of its own, or an earlier one replaced on purpose).
"""

from __future__ import annotations

import math
import re
import types
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, Union, cast, get_args, get_origin

import pytest
from annotated_types import Ge, Le
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from kimi_batch.llama import TokenLogprob
from kimi_batch.pipeline import QuarantineRow, partition_parts_of, split_partition_key
from kimi_batch.storage import InvalidPartitionError, StorageError
from kimi_batch.warehouse import TABLES, Warehouse, validate_ds, validate_source
from kimi_batch_tests.support.rows import amplified, distilled, quarantined

# Few examples, several rows each: every example commits at least once.
EXAMPLES = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY_EXAMPLES = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# Scripts, combining marks, emoji (joined ones too), NUL and the other control characters, the
# separators a reader could trip on; every code point UTF-8 can encode besides.
_ODD = (
    "日本語中文Русскийعربيעבריתहिन्दी😀👩‍👩‍👧é\u0301\u0338\u20dd"
    "\x00\x01\x1b\x7f\x85\u2028\u2029\u200b\ufeff\t\r\n \"'|=/\\{}[]"
)
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(_ODD)), max_size=12)
# Long text from a short draw repeated: hypothesis keeps its own draws small.
LONG = st.tuples(TEXT, st.integers(1, 20_000)).map(lambda drawn: drawn[0] * drawn[1])
STRINGS = st.one_of(TEXT, LONG)

_INT_EDGES = (INT64_MIN, INT64_MIN + 1, -(1 << 53) - 1, -1, 0, 1, 10, 1 << 31, 1 << 53)
_INT_EDGES += ((1 << 53) + 1, INT64_MAX - 1, INT64_MAX)
_FLOAT_EDGES = (0.0, -0.0, 5e-324, 2.2250738585072014e-308, 0.1, 1e300, 1.7976931348623157e308)
_FLOAT_EDGES += (-1.7976931348623157e308, math.inf, -math.inf, math.nan)
# Fixed offsets, minutes and seconds included: an aware time is stored as naive UTC.
ZONES = st.one_of(
    st.just(UTC),
    st.timedeltas(-timedelta(hours=23, minutes=59), timedelta(hours=23, minutes=59)).map(timezone),
)
DATETIMES = st.one_of(
    st.datetimes(),  # naive: stored as it is, year 1 to 9999
    # aware: a day inside the range, so that UTC holds it whatever the offset
    st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=ZONES),
)
# Values of the wrong kind or range, put in a field now and then: the model refuses them or
# coerces them into a row that must round-trip like any other.
JUNK = st.sampled_from([None, "", "x", "7", -1, 0, 11, 1.5, [], {}, {"a": 1}, math.nan, True])

SOURCES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", fullmatch=True)
KEYS = st.tuples(st.dates().map(date.isoformat), SOURCES)


def _bounds(metadata: list[Any]) -> tuple[Any, Any]:
    """The `ge`/`le` bounds a field declares (None: unbounded)."""
    low = next((item.ge for item in metadata if isinstance(item, Ge)), None)
    high = next((item.le for item in metadata if isinstance(item, Le)), None)
    return low, high


def _ints(metadata: list[Any]) -> st.SearchStrategy[int]:
    low, high = _bounds(metadata)
    low, high = max(INT64_MIN, low if low is not None else INT64_MIN), high
    high = min(INT64_MAX, high if high is not None else INT64_MAX)
    edges = [edge for edge in (*_INT_EDGES, low, high) if low <= edge <= high]
    return st.one_of(st.integers(low, high), st.sampled_from(edges))


def _floats(metadata: list[Any]) -> st.SearchStrategy[float]:
    low, _ = _bounds(metadata)
    edges = [edge for edge in _FLOAT_EDGES if low is None or edge >= low]
    drawn = st.floats(min_value=low, allow_nan=low is None)
    return st.one_of(drawn, st.sampled_from(edges))


def _value(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values of one field, from its annotation (the shapes `warehouse.schema` maps)."""
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        (inner,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return st.one_of(st.none(), _value(inner, metadata))
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if origin is list:
        (item,) = get_args(annotation)
        return st.lists(_value(item, []), max_size=3)  # empty lists included
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _fields(annotation)
    by_type: dict[Any, st.SearchStrategy[Any]] = {
        str: STRINGS,
        int: _ints(metadata),
        float: _floats(metadata),
        datetime: DATETIMES,
    }
    return by_type[annotation]


def _fields(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            name: _value(field.annotation, field.metadata)
            for name, field in model.model_fields.items()
        }
    )


@st.composite
def _rows(draw: st.DrawFn, model: type[BaseModel]) -> list[BaseModel]:
    """Rows of `model`; a drawn row the model refuses (ValidationError only) is left out."""
    rows: list[BaseModel] = []
    for values in draw(st.lists(_fields(model), max_size=4)):
        if draw(st.integers(0, 5)) == 0:
            values[draw(st.sampled_from(sorted(values)))] = draw(JUNK)
        # The model's refusal (ValidationError, nothing else) is the other outcome allowed.
        with suppress(ValidationError):
            rows.append(model(**values))
    return rows


def _as_stored(value: Any) -> Any:
    """`value` as the tables keep it: an aware time as naive UTC (nothing else changes; `fold`
    only tells apart the times of a zone's repeated hour, and equality ignores it)."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.replace(fold=0)
    if isinstance(value, dict):
        return {key: _as_stored(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


def _null_reads_empty(model: type[BaseModel]) -> list[str]:
    """The nullable lists of structs: pyiceberg writes a null one as empty, so it reads []
    (apache/iceberg-python#3833, pinned in test_tables: the one change a round trip makes)."""
    found: list[str] = []
    for name, field in model.model_fields.items():
        args = get_args(field.annotation)
        lists = [arg for arg in args if get_origin(arg) is list]
        if type(None) in args and lists:
            (item,) = get_args(lists[0])
            if isinstance(item, type) and issubclass(item, BaseModel):
                found.append(name)
    return found


def _key(row: BaseModel) -> str:
    """A row's stored values, compared by repr: NaN equals NaN and -0.0 differs from 0.0."""
    values = row.model_dump()
    for name in _null_reads_empty(type(row)):
        values[name] = [] if values[name] is None else values[name]
    return repr(_as_stored(values))


def _same(got: list[BaseModel], written: list[BaseModel]) -> None:
    """The same rows, value for value, as many times each (a partition keeps no order)."""
    assert Counter(map(_key, got)) == Counter(map(_key, written))


# ---- 1. a row written reads back exactly --------------------------------------------------------


@pytest.mark.parametrize("table", list(TABLES))
def test_rows_written_to_a_partition_read_back_exactly(tmp_path: Path, table: str) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    model = TABLES[table]

    @EXAMPLES
    @given(key=KEYS, rows=_rows(model))
    def written_reads_back(key: tuple[str, str], rows: list[BaseModel]) -> None:
        ds, source = key
        written = warehouse.write_partition(table, ds, source, rows)
        assert written.rows == len(rows)
        _same(warehouse.read_rows(table, ds, source, model), rows)
        frame = warehouse.read_partition(table, ds, source)
        assert frame["ds"].to_list() == [ds] * len(rows)
        assert frame["source"].to_list() == [source] * len(rows)
        assert warehouse.has_partition(table, ds, source) == bool(rows)

    written_reads_back()


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, value) of every int, str and datetime inside a row's drawn values."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list):
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, (*path, index))]
    if isinstance(value, bool):
        return []
    return [(path, value)] if isinstance(value, int | str | datetime) else []


def _replaced(values: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(values, dict):
        return {**values, head: _replaced(values[head], rest, new)}
    return [
        _replaced(item, rest, new) if index == head else item for index, item in enumerate(values)
    ]


def _unstorable(value: Any) -> st.SearchStrategy[Any]:
    """A value of the same kind as `value` that no column can hold."""
    if isinstance(value, str):
        return st.tuples(TEXT, TEXT).map(lambda parts: f"{parts[0]}\udc80{parts[1]}")
    if isinstance(value, datetime):
        ahead, behind = timezone(timedelta(hours=1)), timezone(timedelta(hours=-1))
        edges = [datetime(1, 1, 1, tzinfo=ahead), datetime.max.replace(tzinfo=behind)]
        return st.sampled_from(edges)
    return st.sampled_from([INT64_MAX + 1, INT64_MIN - 1, 1 << 64, 1 << 100])


@st.composite
def _one_unstorable(draw: st.DrawFn, model: type[BaseModel]) -> BaseModel | None:
    """A row the model accepts with one value no column holds; None when the model refuses."""
    values = draw(_fields(model))
    path, value = draw(st.sampled_from(_leaves(values)))
    try:
        return model(**_replaced(values, path, draw(_unstorable(value))))
    except ValidationError:
        return None  # a constrained field: refused by the model, as the property allows


def test_a_row_no_column_can_hold_is_a_storage_error_and_the_partition_is_kept(
    tmp_path: Path,
) -> None:
    """Refused as a whole, naming the table and the row, before anything is written: the
    driver skips such a partition and lands the others (a raw error would end the run)."""
    warehouse = Warehouse(tmp_path / "warehouse")

    @EXAMPLES
    @given(data=st.data(), table=st.sampled_from(list(TABLES)), key=KEYS)
    def refused(data: st.DataObject, table: str, key: tuple[str, str]) -> None:
        model = TABLES[table]
        good = data.draw(_rows(model), label="good")
        bad = data.draw(_one_unstorable(model), label="bad")
        warehouse.write_partition(table, *key, good)
        if bad is None:
            return
        at = data.draw(st.integers(0, len(good)), label="at")
        with pytest.raises(StorageError, match=rf"^{table} row {at + 1}\b"):
            warehouse.write_partition(table, *key, [*good[:at], bad, *good[at:]])
        _same(warehouse.read_rows(table, *key, model), good)

    refused()


# The defects behind the property above, one example each. Before the fix in `tables._stored`
# the first raised polars' ComputeError, the second a UnicodeEncodeError, the third an
# OverflowError (raw errors: the driver's landing skips a partition on a KimiBatchError, any
# other ends the run), and the last was written, its token id stored as null.


def _kept_after_refusal(tmp_path: Path, table: str, good: list[Any], bad: Any) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    warehouse.write_partition(table, "2024-05-01", "demo", good)
    with pytest.raises(StorageError, match=rf"^{table} row 2\b"):
        warehouse.write_partition(table, "2024-05-01", "demo", [*good, bad])
    _same(warehouse.read_rows(table, "2024-05-01", "demo", TABLES[table]), good)


def test_an_integer_past_64_bits_is_refused_not_a_polars_error(tmp_path: Path) -> None:
    good = quarantined(1)
    bad = good[0].model_copy(update={"line": INT64_MAX + 1})
    _kept_after_refusal(tmp_path, "quarantine", good, bad)


def test_a_lone_surrogate_is_refused_not_a_unicode_error(tmp_path: Path) -> None:
    good = quarantined(1)
    bad = good[0].model_copy(update={"raw": "{\udc80}"})
    _kept_after_refusal(tmp_path, "quarantine", good, bad)


def test_a_zoned_time_utc_cannot_hold_is_refused_not_an_overflow(tmp_path: Path) -> None:
    good = quarantined(1)
    at = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    _kept_after_refusal(tmp_path, "quarantine", good, good[0].model_copy(update={"created_at": at}))


def test_a_nested_integer_past_64_bits_is_refused_not_stored_as_null(tmp_path: Path) -> None:
    good = distilled(amplified(1))
    token = TokenLogprob(token="a", logprob=-0.5, top=[], id=INT64_MAX + 1)
    _kept_after_refusal(
        tmp_path, "distilled", good, good[0].model_copy(update={"logprobs": [token]})
    )


# ---- 2. replacing a partition changes no other ------------------------------------------------


def _by_partition(warehouse: Warehouse, table: str) -> dict[tuple[str, str], Counter[str]]:
    """Every partition's rows, read with `read_table` (the whole table at once)."""
    model, found = TABLES[table], dict[tuple[str, str], Counter[str]]()
    for record in warehouse.read_table(table).iter_rows(named=True):
        key = (record.pop("ds"), record.pop("source"))
        found.setdefault(key, Counter())[_key(model.model_validate(record))] += 1
    return found


# A few keys shared by every example, so that later ones replace earlier partitions; names that
# differ only by case, by a dot or by a suffix are neighbours a sloppy filter would mix up.
_NEAR = st.sampled_from([("2024-05-01", s) for s in ("a", "A", "a.v2", "a_v2", "b")])
NEAR_KEYS = st.one_of(_NEAR, st.just(("2024-05-02", "a")), KEYS)
STAGES = st.sampled_from(["input", "amplify", "distill"])


def test_replacing_a_partition_never_changes_another(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")
    expected: dict[str, dict[tuple[str, str], list[BaseModel]]] = {table: {} for table in TABLES}

    @EXAMPLES
    @given(data=st.data(), table=st.sampled_from(list(TABLES)))
    def replaced(data: st.DataObject, table: str) -> None:
        model, partitions = TABLES[table], expected[table]
        for _ in range(data.draw(st.integers(2, 4), label="writes")):
            key = data.draw(NEAR_KEYS, label="key")
            rows = data.draw(_rows(model), label="rows")
            if table == "quarantine" and data.draw(st.booleans(), label="one stage"):
                # A stage's quarantine rows replaced: the partition's other stages' rows stay.
                stage = data.draw(STAGES, label="stage")
                mine = [row.model_copy(update={"stage": stage}) for row in rows]
                warehouse.replace_quarantine(*key, stage, mine)
                before = cast(list[QuarantineRow], partitions.get(key, []))
                kept = [row for row in before if row.stage != stage]
                partitions[key] = [*kept, *mine]
            else:
                warehouse.write_partition(table, *key, rows)
                partitions[key] = rows
            # Checked after every write: a later write to the same key would hide the damage.
            assert _by_partition(warehouse, table) == {
                held: Counter(map(_key, rows)) for held, rows in partitions.items() if rows
            }
        assert warehouse.partitions(table) == sorted(
            held for held, rows in partitions.items() if rows
        )

    replaced()


# ---- 3. partition keys ----------------------------------------------------------------------------

_ISO_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_SOURCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Near misses: any Unicode digit (\d), a month or day out of range, a space or a newline added,
# a character past the 128, a leading dot or underscore, a key separator.
DS_CANDIDATES = st.one_of(
    st.dates().map(date.isoformat),
    st.dates(),
    st.datetimes(),
    st.from_regex(r"\d{4}-\d{2}-\d{2}", fullmatch=True),
    st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", fullmatch=True),
    st.tuples(st.dates().map(date.isoformat), TEXT).map("".join),
    TEXT,
    st.none(),
    st.integers(),
)
SOURCE_CANDIDATES = st.one_of(
    SOURCES,
    st.from_regex(r"[A-Za-z0-9_.|=/ -]{0,130}", fullmatch=True),
    st.tuples(SOURCES, TEXT).map("".join),
    st.just("x" * 129),
    TEXT,
    st.none(),
    st.integers(),
)


def _checked(validate: Callable[[Any], str], value: Any) -> str | None:
    """`validate(value)`, or None when it refused with InvalidPartitionError (any other
    exception fails the test)."""
    try:
        return validate(value)
    except InvalidPartitionError:
        return None


def test_a_ds_is_an_iso_day_or_refused_clearly() -> None:
    @KEY_EXAMPLES
    @given(ds=DS_CANDIDATES)
    def checked(ds: Any) -> None:
        accepted = _checked(validate_ds, ds)
        if accepted is None:
            return
        assert _ISO_DAY.fullmatch(accepted)  # ASCII digits: one partition a day
        assert date.fromisoformat(accepted).isoformat() == accepted
        assert accepted == (ds.isoformat() if isinstance(ds, date) else ds)
        assert validate_ds(accepted) == accepted

    checked()


def test_a_source_is_a_plain_name_or_refused_clearly() -> None:
    @KEY_EXAMPLES
    @given(source=SOURCE_CANDIDATES)
    def checked(source: Any) -> None:
        accepted = _checked(validate_source, source)
        if accepted is not None:
            assert accepted == source
            assert _SOURCE.fullmatch(accepted)  # no "|": the key splits back

    checked()


def test_an_accepted_key_round_trips_through_its_key_string_and_a_refused_one_touches_nothing(
    tmp_path: Path,
) -> None:
    warehouse = Warehouse(tmp_path / "warehouse")

    @KEY_EXAMPLES
    @given(ds=DS_CANDIDATES, source=SOURCE_CANDIDATES, table=st.sampled_from(list(TABLES)))
    def checked(ds: Any, source: Any, table: str) -> None:
        good_ds, good_source = _checked(validate_ds, ds), _checked(validate_source, source)
        if good_ds is None or good_source is None:
            with pytest.raises(InvalidPartitionError):
                warehouse.read_partition(table, ds, source)
            with pytest.raises(InvalidPartitionError):
                warehouse.write_partition(table, ds, source, [])
            return
        key = f"{good_ds}|{good_source}"
        assert split_partition_key(key) == (good_ds, good_source)
        assert partition_parts_of(key) == (good_ds, good_source)
        assert warehouse.read_partition(table, ds, source).is_empty()
        assert not warehouse.has_partition(table, ds, source)

    checked()
    assert list(tmp_path.iterdir()) == []  # nothing is created by a read or a refused write


def test_a_key_string_splits_back_into_what_it_joined_or_is_refused_clearly() -> None:
    @KEY_EXAMPLES
    @given(raw=st.one_of(TEXT, st.from_regex(r"[^|]{0,12}(\|[^|]{0,12}){0,3}", fullmatch=True)))
    def checked(raw: str) -> None:
        parts = split_partition_key(raw)
        if parts is None:
            with pytest.raises(ValueError, match=r"not a date\|source partition key"):
                partition_parts_of(raw)
            return
        ds, source = parts
        assert ds
        assert source
        assert "|" not in ds + source
        assert f"{ds}|{source}" == raw
        for validate, value in ((validate_ds, ds), (validate_source, source)):
            _checked(validate, value)

    checked()
