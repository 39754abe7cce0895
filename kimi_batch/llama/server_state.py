"""What llama-server says about itself: `/health`, `/props`, `/slots` (and a slot's save or
restore), `/metrics`. Unknown fields are ignored, so a newer server never breaks the client;
states are a closed enum."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class HealthState(StrEnum):
    """The closed set of states `/health` reports."""

    OK = "ok"
    LOADING = "loading"


class _GenerationParams(_Lenient):
    n_predict: int = -1


class _DefaultGenerationSettings(_Lenient):
    n_ctx: int | None = None
    params: _GenerationParams = Field(default_factory=_GenerationParams)


class ServerProps(_Lenient):
    """`GET /props`: what the server was started with."""

    model_path: str = ""
    total_slots: int = Field(default=1, ge=1)
    default_generation_settings: _DefaultGenerationSettings = Field(
        default_factory=_DefaultGenerationSettings
    )
    build_info: str = ""
    chat_template: str = ""
    chat_template_caps: dict[str, object] = Field(
        default_factory=dict, description="What the chat template renders (llama.cpp's caps)."
    )

    @property
    def renders_tools(self) -> bool | None:
        """Whether the chat template writes a request's tools into the prompt (llama.cpp drops
        them when it does not); None when the build does not say (ik_llama.cpp, older ones)."""
        supported = self.chat_template_caps.get("supports_tools")
        return supported if isinstance(supported, bool) else None

    @property
    def n_ctx(self) -> int | None:
        """Context per slot as the server reports it."""
        return self.default_generation_settings.n_ctx

    @property
    def n_predict(self) -> int:
        """Server-side cap on generated tokens; -1 means unlimited."""
        return self.default_generation_settings.params.n_predict


class SlotNextToken(_Lenient):
    """`next_token` of a slot: `n_decoded` grows with every token generated."""

    n_decoded: int = 0
    n_remain: int | None = None
    has_next_token: bool = False


class SlotState(_Lenient):
    """One entry of `GET /slots`."""

    id: int
    n_ctx: int | None = None
    is_processing: bool = False
    id_task: int | None = None
    next_token: SlotNextToken | list[SlotNextToken] | None = None
    # Prompt progress where the build reports it (a long prefill decodes nothing for minutes).
    n_past: int | None = None
    n_prompt_tokens_processed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _processing_from_state(cls, data: Any) -> Any:
        """ik_llama.cpp reports `state` (0 idle, 1 processing) where llama.cpp reports
        `is_processing`: without this every slot of it would read as idle."""
        if isinstance(data, dict) and "is_processing" not in data:
            state = data.get("state")
            if isinstance(state, int) and not isinstance(state, bool):
                return {**data, "is_processing": state != 0}
        return data

    @property
    def prompt_progress(self) -> int:
        """Prompt tokens the slot has evaluated so far, as far as this build tells."""
        return (self.n_past or 0) + (self.n_prompt_tokens_processed or 0)

    @property
    def n_decoded(self) -> int:
        """Tokens decoded by the slot's current task (builds differ: object or list)."""
        token = self.next_token
        if isinstance(token, list):
            return sum(t.n_decoded for t in token)
        return token.n_decoded if token is not None else 0


class SlotFileResult(_Lenient):
    """Result of a slot `save`, `restore` or `erase` action."""

    id_slot: int
    filename: str | None = None
    n_saved: int | None = None
    n_written: int | None = None
    n_restored: int | None = None
    n_read: int | None = None
    n_erased: int | None = None
    timings: dict[str, float] = Field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.n_saved or self.n_restored or self.n_erased or 0

    @property
    def elapsed_ms(self) -> float:
        return sum(self.timings.values())


class ServerMetrics(BaseModel):
    """Counters from the Prometheus `/metrics` endpoint (`--metrics`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens_total: float = 0.0
    tokens_predicted_total: float = 0.0
    n_decode_total: float = 0.0
    # Tokens in the KV cache: ik_llama.cpp's only counter that moves while slots work (it has
    # no n_decode_total and adds to the two totals when a slot is released).
    kv_cache_tokens: float = 0.0
    requests_processing: float = 0.0
    requests_deferred: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ServerMetrics:
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0].removeprefix("llamacpp:")
            if key in cls.model_fields:
                try:
                    values[key] = float(value)
                except ValueError:
                    continue
        return cls(**values)
