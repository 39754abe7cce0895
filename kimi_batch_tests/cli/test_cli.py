"""Expected CLI failures are one line on stderr with exit code 2; a bug keeps its traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_batch.cli import commands as cli
from kimi_batch.engine.digest import DigestLintError
from kimi_batch.errors import ConfigError, KimiBatchError, MissingInputError
from kimi_batch.llama.exceptions import LlamaError, SpecMismatchError
from kimi_batch.storage import StorageError
from kimi_batch.warehouse import TrinoUnavailableError
from kimi_batch_tests.support.cli import assert_one_error_line, run_cli

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server


@pytest.mark.slow
def test_a_digest_lint_finding_stops_the_demo_before_any_server_starts(tmp_path: Path) -> None:
    digest = tmp_path / "digest.md"
    digest.write_text("You answer briefly.\nToday is 2024-05-01.\n")
    result = run_cli(tmp_path, "demo", KIMI_BATCH_DIGEST=str(digest))
    assert_one_error_line(result, "cache-breaking", "line 2", "2024-05-01")
    assert not (tmp_path / "home" / "server").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", [("server", "start"), ("demo",)])
def test_a_missing_model_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "no-such-model.gguf"
    result = run_cli(tmp_path, *command, KIMI_BATCH_MODEL=str(missing))
    assert_one_error_line(result, "model file not found", str(missing))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("server", "start", "--no-such-flag"), "--no-such-flag"),
        (("frobnicate",), "invalid choice"),
        # `--date` alone is a day of every source now; a range that ends before it starts is not.
        (("export", "--since", "2026-12-01", "--until", "2026-11-30"), "--since 2026-12-01"),
    ],
)
def test_a_bad_flag_is_one_line(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    assert_one_error_line(run_cli(tmp_path, *args), expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("KIMI_BATCH_LLAMA_PORT", "eighty", "KIMI_BATCH_LLAMA_PORT must be an integer"),
        ("KIMI_BATCH_LLAMA_PORT", "0", "llama_port"),
        ("KIMI_BATCH_TIMEZONE", "America", "KIMI_BATCH_TIMEZONE"),
        ("KIMI_BATCH_LLAMA_CACHE_RAM", "-7", "KIMI_BATCH_LLAMA_CACHE_RAM"),
        ("KIMI_BATCH_NIGHTLY_CRON", "banana", "KIMI_BATCH_NIGHTLY_CRON"),
        ("KIMI_BATCH_LLAMA_EXTRA_ARGS", "'x", "KIMI_BATCH_LLAMA_EXTRA_ARGS"),
        ("KIMI_BATCH_ALERT_WEBHOOK", "http://[::1", "KIMI_BATCH_ALERT_WEBHOOK"),
        ("KIMI_BATCH_ALERT_WEBHOOK", "https://hooks.example/a\tb", "KIMI_BATCH_ALERT_WEBHOOK"),
    ],
)
def test_a_bad_setting_is_one_line(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    assert_one_error_line(run_cli(tmp_path, "server", "status", **{variable: value}), expected)


# ---- in process: which errors are expected -----------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [LlamaError, SpecMismatchError, StorageError, TrinoUnavailableError, ConfigError],
)
def test_every_layer_error_is_a_kimi_batch_error(error: type[Exception]) -> None:
    assert issubclass(error, KimiBatchError)


def test_the_special_errors_keep_their_builtin_bases_for_existing_handlers() -> None:
    assert issubclass(DigestLintError, KimiBatchError)
    assert issubclass(DigestLintError, ValueError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(MissingInputError, FileNotFoundError)


def _status_raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """`kimi-batch server status` whose server lookup raises `error`."""

    def watched_server(_settings: object) -> None:
        raise error

    monkeypatch.setattr(cli, "watched_server", watched_server)


def test_an_expected_error_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _status_raising(monkeypatch, MissingInputError("no input files in /x/inbox"))
    assert cli.main(["server", "status"]) == 2
    assert capsys.readouterr().err == "kimi-batch: error: no input files in /x/inbox\n"


def test_an_unexpected_error_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    _status_raising(monkeypatch, KeyError("a bug"))
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["server", "status"])


def test_the_batch_api_refuses_a_public_address_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Without KIMI_BATCH_API_KEY a key is generated, so only --no-auth can mean "no key".
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    monkeypatch.delenv("KIMI_BATCH_API_KEY", raising=False)
    assert cli.main(["api", "--no-auth", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--no-auth" in error


def _long_digest(path: Path, words: int) -> Path:
    """A lint-clean digest of about `words` x 1.25 tokens (no digits, no dates)."""
    path.write_text(" ".join(["Answer with care and cite the source."] * (words // 7)) + "\n")
    return path


def test_server_start_refuses_a_context_its_digest_does_not_fit_before_any_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ~10k tokens of digest (by characters) in the default 16,384 over 4 slots.
    digest = _long_digest(tmp_path / "digest.md", 8_000)
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIMI_BATCH_DIGEST", str(digest))
    # Were the check missing, the start would fail on this binary instead, never load a model.
    monkeypatch.setenv("KIMI_BATCH_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    monkeypatch.delenv("KIMI_BATCH_LLAMA_URL", raising=False)
    for name in ("KIMI_BATCH_LLAMA_CTX", "KIMI_BATCH_LLAMA_PARALLEL", "KIMI_BATCH_LLAMA_N_PREDICT"):
        monkeypatch.delenv(name, raising=False)

    assert cli.main(["server", "start"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a slot cannot hold digest ~" in err
    assert "+ prompt 256 + answer 1,024" in err
    assert "a slot holds 4,096 (context 16,384 over 4 slots)" in err
    assert "set KIMI_BATCH_LLAMA_CTX to at least" in err
    assert not (tmp_path / "home" / "server" / "server.pid").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("warehouse", "maintain", "--retention-days", "-1"), "a retention is 1 day or more"),
        (("warehouse", "maintain", "--retention-days", "0"), "a retention is 1 day or more"),
        (("api", "--port", "70000"), "a port is 1 to 65535"),
        (("api", "--port", "0"), "a port is 1 to 65535"),
        (("digest", "lint", "d.md", "--allow", "["), "not a regular expression"),
        (("server", "start", "--load-timeout", "0"), "a number of seconds above 0"),
        (("server", "start", "--load-timeout", "-5"), "a number of seconds above 0"),
        (("server", "start", "--load-timeout", "nan"), "a number of seconds above 0"),
    ],
    ids=[
        "retention-negative",
        "retention-zero",
        "port-too-big",
        "port-zero",
        "bad-regex",
        "load-timeout-zero",
        "load-timeout-negative",
        "load-timeout-nan",
    ],
)
def test_an_out_of_range_or_malformed_option_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    args: tuple[str, ...],
    says: str,
) -> None:
    """Found by review: -1 days expired every snapshot of minutes ago and 0 meant the default;
    --port 70000 listened on 4464 and said 70000; a bad --allow was a re.error traceback;
    --load-timeout 0 meant the default and -5 gave up at once."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert says in error
    assert "Traceback" not in error
    assert not (tmp_path / "warehouse").exists()


def test_files_the_commands_cannot_use_are_one_line_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A digest that is not UTF-8 (digest lint, export --system, status), a KIMI_BATCH_MODEL
    that is not a GGUF (export --format kd) and a catalog written to a folder or under a path
    that does not exist (publish): each was a traceback."""
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    binary = tmp_path / "digest.md"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert cli.main(["digest", "lint", str(binary)]) == 2
    assert "is not UTF-8 text (byte 0" in capsys.readouterr().err
    for output in (tmp_path, tmp_path / "no" / "such" / "x.properties"):
        if output.parent.name == "such":
            (tmp_path / "no").write_text("a file, not a folder")
        assert cli.main(["publish", "--output", str(output)]) == 2
        error = capsys.readouterr().err
        assert error.startswith("kimi-batch: error: cannot write the catalog to")
        assert error.count("\n") == 1
