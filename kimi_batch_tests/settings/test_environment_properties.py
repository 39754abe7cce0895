"""Hostile-environment properties of `Settings.from_env` (the KIMI_BATCH_* contract,
docs/reference/environment.md): whatever the variables the settings know hold, reading them gives
a `Settings` or a one-line `ConfigError` naming a variable that was set, and that variable alone
is refused too. Any other exception is a traceback where the CLI prints one line and exits 2, and
a code location that does not load.

`from_env` reads the process environment (it takes no mapping), so each example sets its
variables in a `MonkeyPatch.context()` that undoes them. The variables are every field's
`variable_of`, and the field-name spellings of the aliased fields (refused by design,
test_settings), so a field added later is drawn too. The values: text of every kind (unicode,
control characters, the bytes a non-UTF-8 environment reads as surrogates; never NUL, which no
environment holds), numbers in odd spellings, paths (`~user`, a symlink loop), URLs, long
strings, and valid values.

No function renders a `Settings` back into variables, so there is no round-trip property; the
second property pins the other direction instead: an environment of valid values is read, each
value as written.
"""

from __future__ import annotations

import os
import re
import shlex
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from kimi_batch.settings import ConfigError, Settings, variable_of

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- the variables ------------------------------------------------------------------------------

FIELD_OF = {variable_of(name): name for name in Settings.model_fields}
# The field-name spelling of an aliased field is never read: it is refused, naming itself.
SPELLINGS = sorted(
    f"KIMI_BATCH_{name.upper()}"
    for name, info in Settings.model_fields.items()
    if isinstance(info.validation_alias, str)
)
VARIABLES = sorted(FIELD_OF) + SPELLINGS
_NAMED = re.compile(r"KIMI_BATCH_[A-Z0-9_]+")

# ---- hostile values -----------------------------------------------------------------------------

# Scripts, combining marks, emoji, invisible and line-breaking characters, shell and URL syntax.
_ODD = (
    "日本語عربي😀👩‍👩‍👧é\u0301\x01\x07\x08\x0b\x0c\x1b\x1c\x7f\x85\u2028\u2029\u200b\ufeff"
    "\t\r\n \"'`$,;:=\\/~*@#?%[]{}|"
)
# A byte that is not UTF-8 in the real environment reads as one of these (surrogateescape).
_UNDECODABLE = st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)
TEXT = st.text(
    st.one_of(
        st.characters(codec="utf-8", exclude_characters="\x00"), st.sampled_from(_ODD), _UNDECODABLE
    ),
    max_size=30,
)
NUMBERS = st.one_of(
    st.sampled_from([" 13", "13 ", "\t13\n", "+13", "1e3", "1E3", "-0", "-0.0", "0x10", "0o10"]),
    st.sampled_from(["0b1", "1_000", "١٣", "\uff11\uff13", "²", "inf", "-inf", "Infinity", "nan"]),
    st.sampled_from(["NaN", "1e309", "-1e-320", "-1", "0", "65535", "65536", "0.5", "1.", ".5"]),
    st.sampled_from(["9" * 400, "-" + "9" * 400]),
)
# Near misses of each kind of value the variables take, a kind to a list so that each is drawn
# often; "loop" is a symlink loop in the working directory.
PATHS = st.sampled_from(
    ["~", "~nosuchuser", "~nosuchuser/x", "~/x", "loop", "loop/x", ".", "..", "/", "//", "../etc"]
)
URLS = st.one_of(
    st.sampled_from(["s3://", "s3://b/p/", "s3:///x", "gs://b", "http://", "http://[::1"]),
    st.sampled_from(["http://u:pa/ss@h", "https://h:99999", "http://\u2100/", "mysql://h/db"]),
    st.sampled_from(["postgresql://h/db", "postgresql://h/", "postgresql://[::1/db"]),
)
WORDS = st.one_of(
    st.sampled_from(["on", "OFF", "Yes", "running", " Running ", "stopped", "auto", "off"]),
    st.sampled_from(
        ["@daily", "0 2 * * *", "60 * * * *", "* * * *", "*/0 * * * *", "0 2 * * fri#2"]
    ),
    st.sampled_from(["UTC", "Europe/Paris", "America", "/etc/passwd", "07:00", "24:00", "07:00Z"]),
    st.sampled_from(["7", "2024-02-29", "2023-02-29", "0001-01-01", "'x", '"', "a,b", " , ", ","]),
    st.sampled_from(["prompt+answer", "ngram-mod", "ngram mod", "-mla 3 'x"]),
)
LONG = st.tuples(st.sampled_from(["x", "9", "/a", "é", "😀", "~", " "]), st.integers(500, 20_000))
HOSTILE = st.one_of(
    TEXT,
    NUMBERS,
    WORDS,
    PATHS,
    URLS,
    LONG.map(lambda part: part[0] * part[1]),
    st.tuples(st.one_of(NUMBERS, WORDS, PATHS, URLS), TEXT).map("".join),
    st.tuples(TEXT, st.one_of(NUMBERS, WORDS, PATHS, URLS)).map("".join),
)

# ---- valid values: (the variable's text, the field's value read from it) ------------------------

Valid = st.SearchStrategy[tuple[str, Any]]

# Visible text with no surrounding whitespace (which is stripped).
PLAIN = st.text(st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=20)
_PATH = st.from_regex(r"(~/)?p[a-z0-9_.-]{0,8}(/[a-z0-9_-]{1,8}){0,2}", fullmatch=True)
PATH: Valid = _PATH.map(lambda text: (text, Path(text).expanduser().resolve()))
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5}){0,2}", fullmatch=True)
_URL = st.builds(
    "{}://{}{}{}".format,
    st.sampled_from(["http", "https"]),
    _HOST,
    st.one_of(st.just(""), st.integers(1, 65535).map(lambda port: f":{port}")),
    st.from_regex(r"(/[a-zA-Z0-9_.-]{1,8}){0,2}", fullmatch=True),
)
URL: Valid = _URL.map(lambda url: (url, url))
_SEPARATED = st.sampled_from([" ", ",", ", ", "\t"])


def _listed(items: st.SearchStrategy[str]) -> Valid:
    """Space or comma separated items, read as a tuple."""
    return st.tuples(st.lists(items, max_size=4), _SEPARATED).map(
        lambda drawn: (drawn[1].join(drawn[0]), tuple(drawn[0]))
    )


_S3 = st.builds("s3://{}{}".format, _HOST, st.sampled_from(["", "/", "/prefix", "/a/b/"]))
_MODULE = r"[a-z_][a-z0-9_]{0,6}(\.[a-z_][a-z0-9_]{0,6}){0,2}"
_MODULES = st.lists(st.from_regex(_MODULE, fullmatch=True), max_size=3)
_DEFAULT_MODULES: tuple[str, ...] = Settings.model_fields["output_model_modules"].default
_CRONS = ["0 2 * * *", "*/15 * * * *", "30 1 * * mon-fri", "0 3 1,15 * *", "@daily", "0 0 l * *"]
_ZONES = ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Pacific/Chatham"]
_SWITCH = st.sampled_from(["running", "stopped", "RUNNING", "Stopped"]).map(
    lambda text: (text, text.lower() == "running")
)
# The fields whose text is more than their type says (a validator, or a form of its own).
EXPLICIT: dict[str, Valid] = {
    "warehouse": st.one_of(PATH, _S3.map(lambda url: (url, url.rstrip("/")))),
    "s3_endpoint": URL,
    "database_url": st.builds(
        "{}://{}{}/{}".format,
        st.sampled_from(["postgresql", "postgres"]),
        st.sampled_from(["", "kimi@", "kimi:secret@"]),
        _HOST,
        st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
    ).map(lambda url: (url, url)),
    "benchmarks": st.tuples(st.lists(_PATH, max_size=3), _SEPARATED).map(
        lambda drawn: (
            drawn[1].join(drawn[0]),
            tuple(Path(path).expanduser().resolve() for path in drawn[0]),
        )
    ),
    "judge_rubric": PATH,
    "home": PATH,
    "model": PATH,
    "llama_draft_model": PATH,
    "digest": PATH,
    "llama_url": URL,
    "llama_extra_urls": _listed(_URL),
    "llama_extra_args": st.lists(PLAIN, max_size=5).map(
        lambda words: (shlex.join(words), tuple(words))
    ),
    "llama_cache_ram_mib": st.one_of(
        st.integers(0, 1 << 40).map(lambda mib: (str(mib), mib)),
        st.sampled_from(["off", "OFF", "Off"]).map(lambda text: (text, None)),
    ),
    "llama_spec": st.from_regex(r"[a-z0-9-]+(,[a-z0-9-]+){0,2}", fullmatch=True).map(
        lambda spec: (spec, spec)
    ),
    "timezone": st.sampled_from(_ZONES).map(lambda zone: (zone, zone)),
    "nightly_cron": st.sampled_from(_CRONS).map(lambda cron: (cron, cron)),
    "maintenance_cron": st.sampled_from(_CRONS).map(lambda cron: (cron, cron)),
    "nightly_running": _SWITCH,
    "inbox_sensor_running": _SWITCH,
    "night_ends": st.times().map(lambda at: (at.isoformat(), at)),
    "partitions_start": st.dates().map(lambda day: (day.isoformat(), day)),
    "output_model_modules": st.tuples(_MODULES, _SEPARATED).map(
        lambda drawn: (drawn[1].join(drawn[0]), _DEFAULT_MODULES + tuple(drawn[0]))
    ),
    "alert_webhook": URL,
    "api_allowed_hosts": _listed(_HOST),
}
_BOOLS = {"on": True, "off": False, "TRUE": True, "false": False, "1": True, "0": False}


def _bound(info: FieldInfo, name: str) -> Any:
    """The field's `gt`/`ge`/`lt`/`le` constraint, None when it has none."""
    return next((getattr(item, name) for item in info.metadata if hasattr(item, name)), None)


def _generic(info: FieldInfo) -> Valid:
    """Valid values of a field of a plain type: a number in its bounds, a switch, a choice."""
    annotation = info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [arg for arg in get_args(annotation) if arg is not type(None)]
    gt, ge, lt, le = (_bound(info, name) for name in ("gt", "ge", "lt", "le"))
    if annotation is bool:
        return st.sampled_from(sorted(_BOOLS.items()))
    if annotation is int:
        low = ge if ge is not None else (gt + 1 if gt is not None else -(10**9))
        high = le if le is not None else (lt - 1 if lt is not None else low + 10**12)
        return st.integers(low, high).map(lambda number: (str(number), number))
    if annotation is float:
        numbers = st.floats(
            min_value=gt if gt is not None else ge,
            max_value=lt if lt is not None else le,
            exclude_min=gt is not None,
            exclude_max=lt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
        return numbers.map(lambda number: (repr(number), number))
    if get_origin(annotation) is Literal:
        return st.sampled_from(get_args(annotation)).map(lambda choice: (choice, choice))
    # Any other type must be in EXPLICIT: a plain `str` is the only one left.
    assert annotation is str, f"no valid values for a {annotation}: add them to EXPLICIT"
    return PLAIN.map(lambda text: (text, text))


VALID: dict[str, Valid] = {
    name: EXPLICIT[name] if name in EXPLICIT else _generic(info)
    for name, info in Settings.model_fields.items()
}

# ---- reading an environment ---------------------------------------------------------------------


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """Exactly `env`'s KIMI_BATCH_* variables (the session's fixtures set some), undone after."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("KIMI_BATCH_")]:
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        yield


def _read(env: Mapping[str, str]) -> Settings | ConfigError:
    """The settings `env` gives, or the ConfigError; any other exception fails the test."""
    with _environment(env):
        try:
            return Settings.from_env()
        except ConfigError as error:
            return error


@pytest.fixture
def cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A working directory of the test's own (relative paths resolve in it) with a symlink loop
    in it, `loop` (resolving it fails in its own way)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop").symlink_to("loop")
    return tmp_path


# ---- 1. a settings or a one-line ConfigError naming its variable --------------------------------


@st.composite
def _environments(draw: st.DrawFn) -> dict[str, str]:
    """A few known variables, each hostile or valid (a valid neighbour must not be blamed)."""
    env: dict[str, str] = {}
    for variable in draw(st.lists(st.sampled_from(VARIABLES), unique=True, max_size=12)):
        field = FIELD_OF.get(variable)
        valid = VALID[field].map(lambda drawn: drawn[0]) if field is not None else st.nothing()
        env[variable] = draw(st.one_of(HOSTILE, valid))
    return env


def _check_refusal(error: ConfigError, env: Mapping[str, str]) -> None:
    message = str(error)
    # One line: the CLI prints it as the whole of its answer (a value is shown as its repr).
    assert "\n" not in message, message
    assert "\r" not in message, message
    named = _NAMED.search(message)
    assert named is not None, message
    variable = named.group()
    # A variable that was set (an empty one is unset), and the one at fault: alone, it is refused.
    assert env.get(variable), (variable, message)
    assert isinstance(_read({variable: env[variable]}), ConfigError), (variable, message)


def test_any_environment_is_read_or_refused_naming_its_variable(cwd: Path) -> None:
    @EXAMPLES
    @given(env=_environments())
    def read_or_refused(env: dict[str, str]) -> None:
        read = _read(env)
        if isinstance(read, ConfigError):
            _check_refusal(read, env)
        else:
            assert type(read) is Settings

    read_or_refused()


# ---- 2. valid values are read as written --------------------------------------------------------


@st.composite
def _valid_environments(draw: st.DrawFn) -> dict[str, tuple[str, Any]]:
    """Fields (by name) with a valid text each and the value it must read as."""
    fields = draw(st.lists(st.sampled_from(sorted(VALID)), unique=True, max_size=8))
    return {field: draw(VALID[field], label=field) for field in fields}


def test_an_environment_of_valid_values_is_read_as_written(cwd: Path) -> None:
    @settings(EXAMPLES, max_examples=80)
    @given(chosen=_valid_environments())
    def read_as_written(chosen: dict[str, tuple[str, Any]]) -> None:
        read = _read({variable_of(field): text for field, (text, _) in chosen.items()})
        assert isinstance(read, Settings), read
        for field, (_, value) in chosen.items():
            assert getattr(read, field) == value, field

    read_as_written()


# The defect behind the first property, one example each: pathlib's `expanduser` and `resolve`
# raise RuntimeError (a `~user` of no user, no home at all; a symlink loop), which pydantic does
# not turn into a validation error, so before the fix in `environment.local_path` each of these
# ended `from_env` with a raw RuntimeError and a traceback, naming no variable.


@pytest.mark.parametrize("value", ["~no-such-user/state", "loop"])
@pytest.mark.parametrize(
    "variable", ["KIMI_BATCH_HOME", "KIMI_BATCH_WAREHOUSE", "KIMI_BATCH_BENCHMARKS"]
)
def test_a_path_that_cannot_be_resolved_is_a_config_error_naming_its_variable(
    cwd: Path, variable: str, value: str
) -> None:
    refused = _read({variable: value})
    assert isinstance(refused, ConfigError)
    assert variable in str(refused)
    assert "\n" not in str(refused)
