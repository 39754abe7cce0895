"""The one exception of the bench package: a measurement could not be taken."""

from __future__ import annotations

from kimi_batch.errors import KimiBatchError

__all__ = ["BenchError"]


class BenchError(KimiBatchError):
    """A llama.cpp tool failed or printed nothing usable, or a contender lost requests."""
