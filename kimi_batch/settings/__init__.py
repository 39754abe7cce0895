"""The environment-variable contract (docs/architecture.md), read in one place.

Every `KIMI_BATCH_*` variable and every default is here and nowhere else. `Settings.from_env` runs
once per process, in the entry points: the code location (`kimi_batch.definitions.defs`) and the
CLI's `main`; everything else takes the `Settings` it is handed (the resources hold it as a
dependency), so tests can build any object without touching the process environment. State file
locations are `Settings.paths` (`kimi_batch.paths.StatePaths`).

The package: `model` (the `Settings` model and `from_env`, read by pydantic-settings),
`environment` (the text forms of a variable pydantic does not read by itself), `defaults` (every default, the files shipped with the package), `cron` (the
schedule's expression checked at read time). Other modules import this facade.
"""

from kimi_batch.errors import ConfigError
from kimi_batch.settings.defaults import (
    DEFAULT_API_MAX_BATCH_REQUESTS,
    DEFAULT_CACHE_RAM_MIB,
    DEFAULT_CTX,
    DEFAULT_FROZEN_AFTER_S,
    DEFAULT_LLAMA_PORT,
    DEFAULT_LOAD_TIMEOUT_S,
    DEFAULT_N_PREDICT,
    DEFAULT_PARALLEL,
    DEFAULT_SLOT_SAVES_MAX,
    DEFAULT_THREADS,
    DEFAULT_TRINO_PORT,
    default_digest_path,
    default_model_path,
    samples_dir,
)
from kimi_batch.settings.model import (
    FlashAttention,
    Settings,
    StateSettings,
    hidden_user_info,
    variable_of,
)
from kimi_batch.settings.quality import QualitySettings

__all__ = [
    "DEFAULT_API_MAX_BATCH_REQUESTS",
    "DEFAULT_CACHE_RAM_MIB",
    "DEFAULT_CTX",
    "DEFAULT_FROZEN_AFTER_S",
    "DEFAULT_LLAMA_PORT",
    "DEFAULT_LOAD_TIMEOUT_S",
    "DEFAULT_N_PREDICT",
    "DEFAULT_PARALLEL",
    "DEFAULT_SLOT_SAVES_MAX",
    "DEFAULT_THREADS",
    "DEFAULT_TRINO_PORT",
    "ConfigError",
    "FlashAttention",
    "QualitySettings",
    "Settings",
    "StateSettings",
    "default_digest_path",
    "default_model_path",
    "hidden_user_info",
    "samples_dir",
    "variable_of",
]
