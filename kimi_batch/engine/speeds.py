"""The last measured speeds of a server, kept across steps and runs.

A batch sizes its watchdog's stall period and its requests' deadlines from the prompt and decode
speeds it measures. A batch that has measured nothing yet (its digest restore, its first
requests) would otherwise wait the unmeasured period (600 s) on a frozen server, and every new
step starts there. So the speeds each batch (and each digest prefill) measures are written to one
small JSON file in the state directory, per model, and the next batch starts from them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

# Writes happen as requests finish; a few per minute say all there is to say.
_MIN_WRITE_INTERVAL_S = 5.0


class MeasuredSpeeds(BaseModel):
    """Per-request prompt and decode speeds of one model, as last measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tok_s: float | None = Field(default=None, gt=0)
    decode_tok_s: float | None = Field(default=None, gt=0)
    measured_at: float = Field(default=0.0, description="Unix time of the last measurement.")


class SpeedStore:
    """`{model: MeasuredSpeeds}` in one JSON file; unreadable or missing reads as nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written_at = 0.0

    def _read_all(self) -> dict[str, MeasuredSpeeds]:
        try:
            raw = json.loads(self.path.read_text())
            return {str(k): MeasuredSpeeds.model_validate(v) for k, v in dict(raw).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, ValidationError) as error:
            # A torn or foreign file must not stop a batch: it only loses the head start.
            logger.warning("ignoring unreadable measured speeds %s: %s", self.path, error)
            return {}

    def load(self, model: str) -> MeasuredSpeeds:
        return self._read_all().get(model, MeasuredSpeeds())

    def save(self, model: str, speeds: MeasuredSpeeds, *, force: bool = True) -> None:
        """Write `speeds` for `model` (atomically); unforced writes are spaced a few s apart."""
        now = time.monotonic()
        if not force and now - self._written_at < _MIN_WRITE_INTERVAL_S:
            return
        self._written_at = now
        every = self._read_all()
        every[model] = speeds
        temp = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temp.write_text(
                json.dumps({k: v.model_dump(mode="json") for k, v in every.items()}, indent=2)
            )
            temp.replace(self.path)
        except OSError as error:
            logger.warning("could not keep the measured speeds in %s: %s", self.path, error)
            with contextlib.suppress(OSError):
                temp.unlink()
