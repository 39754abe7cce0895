"""The one exception of the bench package: a measurement could not be taken."""

from __future__ import annotations

__all__ = ["BenchError"]


class BenchError(Exception):
    """A llama.cpp tool failed or printed nothing usable, or a contender lost requests."""
