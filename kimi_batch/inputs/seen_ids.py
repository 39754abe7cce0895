"""A compact set of input ids for duplicate detection while an input file streams by.

A Python `set[str]` costs ~100 bytes an id; an inbox file of short rows holds millions of ids, and
the pipeline shares its box with the model's weights. Here an id is an 8-byte BLAKE2b digest in an
open-addressing table of machine words (12 bytes a slot with the line of first sight, at most
three quarters full, so 16-32 bytes an id): two different ids collide with probability ~n²/2⁶⁵,
about 1e-6 at six million ids.
"""

from __future__ import annotations

import hashlib
from array import array

_INITIAL_SLOTS = 1 << 12
_EMPTY = 0  # a digest of 0 is stored as 1: one more collision in 2⁶⁴ is harmless
_NO_LINE = 0  # lines are 1-based; 0 stands for "no line" (and for a line past 2³²)
_MAX_LINE = (1 << 32) - 1


def _digest(input_id: str) -> int:
    value = int.from_bytes(
        hashlib.blake2b(input_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
    )
    return value or 1


class SeenIds:
    """Input ids seen so far in one file, each with the line it was first seen on."""

    def __init__(self) -> None:
        self._keys = array("Q", bytes(8 * _INITIAL_SLOTS))
        self._lines = array("I", bytes(4 * _INITIAL_SLOTS))
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, input_id: str, line: int | None) -> bool:
        """Record `input_id` first seen at `line`; False when it was already there."""
        key = _digest(input_id)
        slot = self._slot(key)
        if self._keys[slot] == key:
            return False
        self._keys[slot] = key
        self._lines[slot] = line if line is not None and line <= _MAX_LINE else _NO_LINE
        self._size += 1
        if 4 * self._size > 3 * len(self._keys):
            self._grow()
        return True

    def first_line(self, input_id: str) -> int | None:
        """The line `input_id` was first seen on (None when unknown or never seen)."""
        key = _digest(input_id)
        slot = self._slot(key)
        return self._lines[slot] or None if self._keys[slot] == key else None

    def __contains__(self, input_id: object) -> bool:
        if not isinstance(input_id, str):
            return False
        key = _digest(input_id)
        return self._keys[self._slot(key)] == key

    def _slot(self, key: int) -> int:
        """The slot holding `key`, else the empty slot where it belongs (linear probing)."""
        mask = len(self._keys) - 1
        slot = key & mask
        while (found := self._keys[slot]) != _EMPTY and found != key:
            slot = (slot + 1) & mask
        return slot

    def _grow(self) -> None:
        keys, lines = self._keys, self._lines
        slots = 2 * len(keys)
        self._keys = array("Q", bytes(8 * slots))
        self._lines = array("I", bytes(4 * slots))
        mask = slots - 1
        for key, line in zip(keys, lines, strict=True):
            if key == _EMPTY:
                continue
            slot = key & mask
            while self._keys[slot] != _EMPTY:
                slot = (slot + 1) & mask
            self._keys[slot] = key
            self._lines[slot] = line
