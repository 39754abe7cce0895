"""The KIMI_BATCH_* environment contract (docs/architecture.md), read in one place."""

from __future__ import annotations

import os
from datetime import date, time
from pathlib import Path

import pytest

from kimi_batch.defs.partitions import build_date_partitions
from kimi_batch.settings import ConfigError, Settings, default_digest_path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    # Other fixtures (the session's llama_env) set KIMI_BATCH_* for the whole run.
    for name in [n for n in os.environ if n.startswith("KIMI_BATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = Settings.from_env()
    assert settings.home == tmp_path / "var"
    assert settings.paths.warehouse_dir == tmp_path / "var" / "warehouse"
    assert settings.paths.inbox_dir == tmp_path / "var" / "inbox"
    assert settings.llama_port == 8081
    assert settings.trino_port == 8080
    assert settings.trino_host is None
    assert settings.trino_catalog == "iceberg"
    assert settings.trino_schema == "kimi_batch"
    assert settings.llama_threads == 13
    assert settings.llama_cache_ram_mib == 8192
    assert settings.digest == default_digest_path()
    # The embedded default: the state is SQLite files under the state dir.
    assert settings.paths.ledger_state.embedded
    assert settings.paths.ledger_state.path == tmp_path / "var" / "ledger" / "ledger.sqlite3"


def test_a_database_url_puts_every_store_in_its_own_schema_of_it(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("KIMI_BATCH_DATABASE_URL", "postgresql://kimi@db.internal:5432/kimi")
    paths = Settings.from_env().paths
    stores = (paths.ledger_state, paths.manifest_state, paths.api_state)
    assert {store.url for store in stores} == {"postgresql://kimi@db.internal:5432/kimi"}
    assert [store.schema_name for store in stores] == ["kimi_ledger", "kimi_landing", "kimi_api"]


def test_overrides(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("KIMI_BATCH_HOME", str(tmp_path / "state"))
    clean_env.setenv("KIMI_BATCH_WAREHOUSE", str(tmp_path / "lake"))
    clean_env.setenv("KIMI_BATCH_LLAMA_CACHE_RAM", "off")
    clean_env.setenv("KIMI_BATCH_LLAMA_EXTRA_ARGS", "-mla 3 -amb 512 -ot exps=CPU")
    settings = Settings.from_env()
    assert settings.home == tmp_path / "state"
    assert settings.paths.warehouse_dir == tmp_path / "lake"
    assert settings.llama_cache_ram_mib is None
    assert settings.llama_extra_args == ("-mla", "3", "-amb", "512", "-ot", "exps=CPU")


def test_an_s3_warehouse_is_a_url_its_staging_a_folder_and_no_secret_in_settings(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("KIMI_BATCH_WAREHOUSE", "s3://bucket/nightly/")
    clean_env.setenv("KIMI_BATCH_S3_ENDPOINT", "http://127.0.0.1:9000")
    clean_env.setenv("KIMI_BATCH_S3_REGION", "eu-west-1")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-box")
    settings = Settings.from_env()
    assert settings.paths.warehouse_url == "s3://bucket/nightly"
    assert settings.paths.warehouse_location == "s3://bucket/nightly"
    # Partitions are built in the state dir's folder before their upload.
    assert settings.paths.warehouse_dir == tmp_path / "var" / "warehouse"
    assert (settings.s3_endpoint, settings.s3_region) == ("http://127.0.0.1:9000", "eu-west-1")
    assert "secret-of-the-box" not in repr(settings) + settings.model_dump_json()


def test_a_settings_built_in_code_reads_no_variable(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("KIMI_BATCH_LLAMA_PORT", "9999")
    clean_env.setenv("KIMI_BATCH_NIGHTLY_STATUS", "running")
    built = Settings(
        home=tmp_path, model=None, llama_server=None, llama_url=None, digest=default_digest_path()
    )
    assert (built.llama_port, built.nightly_running) == (8081, False)
    read = Settings.from_env()
    assert (read.llama_port, read.nightly_running) == (9999, True)
    assert type(read) is Settings


def test_a_bad_number_is_a_clear_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KIMI_BATCH_LLAMA_PORT", "eighty")
    with pytest.raises(ValueError, match="KIMI_BATCH_LLAMA_PORT must be an integer"):
        Settings.from_env()


def test_new_variables_and_their_errors(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KIMI_BATCH_NIGHT_ENDS", "07:30")
    clean_env.setenv("KIMI_BATCH_MAX_INPUT_MB", "64")
    clean_env.setenv("KIMI_BATCH_LLAMA_EXTRA_URLS", "http://a:8081, http://b:8081")
    clean_env.setenv("KIMI_BATCH_OUTPUT_MODEL_MODULES", "team.schemas")
    settings = Settings.from_env()
    assert settings.night_ends == time(7, 30)
    assert settings.max_input_bytes == 64 * 1024 * 1024
    assert settings.llama_extra_urls == ("http://a:8081", "http://b:8081")
    assert settings.output_model_modules == ("kimi_batch.pipeline.schemas", "team.schemas")

    clean_env.setenv("KIMI_BATCH_NIGHT_ENDS", "seven")
    with pytest.raises(ConfigError, match="KIMI_BATCH_NIGHT_ENDS must be a time of day"):
        Settings.from_env()
    # An offset was taken and then replaced by KIMI_BATCH_TIMEZONE's, silently.
    for with_offset in ("07:00+05:00", "07:00Z"):
        clean_env.setenv("KIMI_BATCH_NIGHT_ENDS", with_offset)
        with pytest.raises(ConfigError, match=r"KIMI_BATCH_NIGHT_ENDS .*carries a UTC offset"):
            Settings.from_env()
    clean_env.delenv("KIMI_BATCH_NIGHT_ENDS")
    clean_env.setenv("KIMI_BATCH_TIMEZONE", "Mars/Olympus")
    with pytest.raises(ConfigError, match="KIMI_BATCH_TIMEZONE"):
        Settings.from_env()


def test_the_url_with_credentials_is_not_in_the_settings_repr(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("KIMI_BATCH_LLAMA_URL", "http://u:hunter2@epyc:8081")
    clean_env.setenv("KIMI_BATCH_LLAMA_API_KEY", "sk-secret")
    clean_env.setenv("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:pg-secret@db:5432/kimi")
    assert "hunter2" not in repr(Settings.from_env())
    assert "sk-secret" not in repr(Settings.from_env())
    assert "pg-secret" not in repr(Settings.from_env())


def test_partitions_start_on_the_install_date_and_stay_there(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    installed = settings.first_partition_date()
    assert installed == settings.today()
    assert settings.paths.partitions_start_file.read_text().strip() == installed.isoformat()
    # Days later the start is the same: partitions made since never leave the definition.
    later = settings.paths.install_date(date(2031, 1, 1))
    assert later == installed
    clean_env.setenv("KIMI_BATCH_PARTITIONS_START", "2024-02-29")
    assert Settings.from_env().first_partition_date() == date(2024, 2, 29)


def test_a_partitions_start_that_is_a_folder_is_refused_not_reset(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Found by review: IsADirectoryError raised out of every caller (a traceback)."""
    settings = Settings.from_env()
    settings.paths.partitions_start_file.mkdir(parents=True)

    with pytest.raises(ConfigError, match="cannot be read as the install's first partition"):
        settings.first_partition_date()
    assert settings.paths.partitions_start_file.is_dir()


def test_a_new_install_shows_no_year_of_empty_partitions(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("KIMI_BATCH_HOME", str(tmp_path / "fresh"))
    keys = build_date_partitions(Settings.from_env()).get_partition_keys()
    assert len(keys) <= 2  # today (and tomorrow's end offset)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KIMI_BATCH_TIMEZONE", "America"),  # a zone directory: IsADirectoryError
        ("KIMI_BATCH_LLAMA_CACHE_RAM", "-7"),
        ("KIMI_BATCH_NIGHTLY_CRON", "banana"),
        ("KIMI_BATCH_NIGHTLY_CRON", "0 25 * * *"),
        ("KIMI_BATCH_LLAMA_EXTRA_ARGS", "'x"),
        ("KIMI_BATCH_ALERT_WEBHOOK", "http://[::1"),
        ("KIMI_BATCH_ALERT_WEBHOOK", "https://hooks.example/a\tb"),
        ("KIMI_BATCH_ALERT_WEBHOOK", "hooks.example/no-scheme"),
        ("KIMI_BATCH_DATABASE_URL", "mysql://db.internal/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://db.internal:5432/"),  # no database named
        # One server by host name: Trino's JDBC catalog and SQLAlchemy's take no socket folder
        # or host list (a host list once ended `kimi-batch publish` with a raw ValueError).
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:sekret@db1:5432,db2:5432/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:sekret@%2Fvar%2Frun%2Fpostgresql/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:sekret@db/kimi?host=/tmp"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:sekret@db:99999/kimi"),
        # A password's `@` or `/` not percent-encoded: libpq reads the password `a` and the
        # host `sekret@db`, and quoted that host in its errors.
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:a@sekret@db/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:a/sekret@db/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:a?sekret@db/kimi"),
        ("KIMI_BATCH_DATABASE_URL", "postgresql://kimi:sekret@db:\u0663/kimi"),  # Arabic 3
        ("KIMI_BATCH_WAREHOUSE", "gs://bucket/warehouse"),  # refused, never a folder `gs:`
        ("KIMI_BATCH_WAREHOUSE", "s3:///no-bucket"),
        ("KIMI_BATCH_S3_ENDPOINT", "127.0.0.1:9000"),  # no scheme
    ],
)
def test_an_unusable_value_is_a_config_error_naming_its_variable(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env()
    message = str(raised.value)
    assert variable in message
    assert "\n" not in message
    assert "sekret" not in message  # a database URL's password is never repeated


@pytest.mark.parametrize(
    "cron", ["0 2 * * *", "*/15 * * * *", "30 1 * * mon-fri", "0 3 1,15 * *", "@daily"]
)
def test_usual_cron_expressions_are_accepted(clean_env: pytest.MonkeyPatch, cron: str) -> None:
    clean_env.setenv("KIMI_BATCH_NIGHTLY_CRON", cron)
    assert Settings.from_env().nightly_cron == cron


# Expressions the settings' own cron grammar once took that Dagster's schedules refuse: each made
# the code location fail to load, the error the check at settings time exists to prevent.
@pytest.mark.parametrize(
    "cron",
    [
        "0 2 30 2 *",  # February 30th never comes
        "0 2 * * 5#6",  # no month has a sixth Friday
        "*/0 * * * *",  # a step of zero
        "0 2 * * 1,",  # an empty list item
        "0 2 * * -",
        "0 2 * * 1#",
        "0 2 * * l",  # croniter's "last" belongs to the day of the month
        "0 2 15w * *",  # croniter 7's nearest weekday, which Dagster's copy of it lacks
    ],
)
def test_a_cron_dagster_refuses_is_a_config_error(clean_env: pytest.MonkeyPatch, cron: str) -> None:
    clean_env.setenv("KIMI_BATCH_NIGHTLY_CRON", cron)
    with pytest.raises(ConfigError, match="KIMI_BATCH_NIGHTLY_CRON"):
        Settings.from_env()


def test_a_webhook_url_is_accepted_and_the_cache_can_be_off(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("KIMI_BATCH_ALERT_WEBHOOK", "https://hooks.slack.com/services/T0/B0/x")
    clean_env.setenv("KIMI_BATCH_LLAMA_CACHE_RAM", "0")
    settings = Settings.from_env()
    assert settings.alert_webhook == "https://hooks.slack.com/services/T0/B0/x"
    assert settings.llama_cache_ram_mib == 0


# The variables whose name is not `KIMI_BATCH_` + the field's (`validation_alias`), with a value
# each takes, and the field-name spelling the environment must not read besides.
_ODD_NAMES = {
    "KIMI_BATCH_LLAMA_CACHE_RAM": ("llama_cache_ram_mib", "5"),
    "KIMI_BATCH_NIGHTLY_STATUS": ("nightly_running", "running"),
    "KIMI_BATCH_INBOX_SENSOR_STATUS": ("inbox_sensor_running", "running"),
    "KIMI_BATCH_INBOX_SENSOR_INTERVAL": ("inbox_sensor_interval_s", "7"),
    "KIMI_BATCH_API_SENSOR_INTERVAL": ("api_sensor_interval_s", "7"),
}


def test_the_odd_names_are_every_variable_not_named_after_its_field() -> None:
    aliased = {
        str(info.validation_alias): name
        for name, info in Settings.model_fields.items()
        if info.validation_alias is not None
    }
    assert aliased == {variable: field for variable, (field, _) in _ODD_NAMES.items()}


@pytest.mark.parametrize("with_documented", [False, True], ids=["alone", "beside-documented"])
@pytest.mark.parametrize("variable", sorted(_ODD_NAMES))
def test_a_field_name_spelling_of_an_odd_variable_is_refused_naming_the_variable(
    clean_env: pytest.MonkeyPatch, variable: str, with_documented: bool
) -> None:
    """Found by review: the environment was read with `validate_by_name`, so pydantic-settings
    read each aliased field from its field-name spelling too (`KIMI_BATCH_NIGHTLY_RUNNING=running`
    switched the nightly schedule on, undocumented); given both spellings, the documented one
    silently won (`..._INTERVAL=7` beside `..._INTERVAL_S=9`: 7, the 9 ignored without a word)."""
    field, value = _ODD_NAMES[variable]
    spelling = f"KIMI_BATCH_{field.upper()}"
    clean_env.setenv(spelling, value)
    if with_documented:
        clean_env.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env()
    message = str(raised.value)
    assert "\n" not in message
    assert spelling in message
    assert variable in message
