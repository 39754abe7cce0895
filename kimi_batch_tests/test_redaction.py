"""The state database's password never shown: URLs and conninfo strings masked, libpq's errors
about them masked, and the state locations' repr masked."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_batch.paths import StateLocation, StatePaths
from kimi_batch.redaction import masked_message, masked_url
from kimi_batch.state import StateError, connect_state, shown_location, shown_url

SECRET = "Sup3r-s3cret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://kimi:{SECRET}@db:5432/kb", "postgresql://kimi:***@db:5432/kb"),
        (
            f"postgresql://kimi@db/kb?sslmode=require&password={SECRET}",
            "postgresql://kimi@db/kb?sslmode=require&password=***",
        ),
        (f"postgres://db/kb?password={SECRET}#x", "postgres://db/kb?password=***#x"),
        (f"postgresql://u:{SECRET}@h1:5,h2:6/kb", "postgresql://u:***@h1:5,h2:6/kb"),
        (f"postgresql://u:p%40{SECRET}/x@db/kb", "postgresql://u:***@db/kb"),
        (
            f"host=db password='{SECRET} two' dbname=kb sslpassword={SECRET}",
            "host=db password=*** dbname=kb sslpassword=***",
        ),
        ("postgresql://kimi@db/kb", "postgresql://kimi@db/kb"),
    ],
)
def test_every_form_of_password_is_masked(url: str, shown: str) -> None:
    assert masked_url(url) == shown
    assert shown_url(url) == shown  # the state layer's name for the same function


@settings(max_examples=300, deadline=None)
@given(
    password=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="@?#&*%"),
        min_size=1,
        max_size=30,
    ),
    query=st.booleans(),
)
def test_no_password_survives_in_a_url(password: str, query: bool) -> None:
    if query:
        url, shown = f"postgresql://db/kb?password={password}", "postgresql://db/kb?password=***"
    else:
        url, shown = f"postgresql://u:{password}@db/kb", "postgresql://u:***@db/kb"
    assert masked_url(url) == shown
    assert masked_message(password, url) == "***"  # what libpq quotes of it


@settings(max_examples=300, deadline=None)
@given(
    password=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30
    ).filter(lambda text: not text.startswith("@") and not ("/" in text and "?" in text)),
    query=st.sampled_from(["", "?sslmode=require", "?application_name=me@box"]),
)
def test_no_user_info_password_survives_whatever_it_holds(password: str, query: str) -> None:
    """libpq reads a password up to an `@` past any `?` or `#` in it, RFC 3986 ends it there:
    every reading is masked. (`u:a/b?c@db` is left out: it reads as a host `u`, a port and a
    query holding an `@`, a valid URL, and such a password is refused as not percent-encoded.)"""
    url = f"postgresql://u:{password}@db/kb{query}"
    assert masked_url(url) == f"postgresql://u:***@db/kb{query}"
    assert masked_message(password, url) == "***"  # what libpq quotes of it


def test_a_query_s_at_sign_is_no_user_info() -> None:
    # The user info once ran to the URL's last `@`: the host was shown as `box`.
    assert masked_url("postgresql://db:5432/kb?application_name=me@box") == (
        "postgresql://db:5432/kb?application_name=me@box"
    )
    assert masked_url("postgresql://u:pw@db/kb?user=me@tenant") == (
        "postgresql://u:***@db/kb?user=me@tenant"
    )


def test_a_password_holding_a_question_mark_or_a_hash_is_masked() -> None:
    # Both SQLAlchemy's make_url and libpq read `pa?ss` as the password; it was shown.
    assert masked_url("postgresql://u:pa?ss@db/kb") == "postgresql://u:***@db/kb"
    assert masked_url("postgresql://u:pa#ss@db/kb?password=x") == (
        "postgresql://u:***@db/kb?password=***"
    )


def test_libpqs_parse_error_quoting_the_password_is_masked(tmp_path: Path) -> None:
    """libpq quotes the token it cannot decode: here the password itself."""
    url = f"postgresql://kimi:{SECRET}%zz@127.0.0.1:1/kb"
    location = StateLocation(path=tmp_path / "x.sqlite3", schema_name="kimi_ledger", url=url)

    with pytest.raises(StateError) as caught:
        connect_state(location)

    message = str(caught.value)
    assert "invalid percent-encoded token" in message
    assert SECRET not in message
    # Not in the traceback either (a run's failure in Dagster's event log shows the chain).
    assert SECRET not in "".join(traceback.format_exception(caught.value))


def test_a_message_loses_the_password_however_it_is_spelt() -> None:
    url = "postgresql://kimi:p%40ss@db/kb?password=other"
    text = 'bad token "p%40ss", user p@ss, param other'

    assert masked_message(text, url) == 'bad token "***", user ***, param ***'


def test_the_state_locations_repr_and_status_name_are_masked(tmp_path: Path) -> None:
    url = f"postgresql://kimi:{SECRET}@db/kb?password={SECRET}"
    paths = StatePaths(home=tmp_path, database_url=url)

    for shown in (repr(paths), str(paths), repr(paths.ledger_state), str(paths.api_state)):
        assert SECRET not in shown
        assert "postgresql://kimi:***@db/kb?password=***" in shown
    assert shown_location(paths.dedup_state) == (
        "postgresql://kimi:***@db/kb?password=*** (schema kimi_quality)"
    )
    assert paths.ledger_state.url == url  # masked when shown only
