"""A fence: proof that a writer still holds what it writes, checked where the write commits.

A partition lease is renewed by a heartbeat, but a holder can stall (swapped out, a VM paused)
between checking its lease and committing its write, and wake after another run took the
partition over. A check before the commit leaves that gap; a fence closes it: `fenced()` opens a
transaction on the lease's store in which the lease is confirmed (and renewed), and the caller
commits its write inside that transaction. A warehouse on an object store switches the
partition's pointer there (one transaction: nobody else can take the lease meanwhile); a local
warehouse renames its file into place there (the store's write lock keeps a new holder from
taking the lease until the rename is done).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from kimi_batch.paths import StateLocation
from kimi_batch.state.database import StateDatabase

__all__ = ["Fence"]


class Fence(Protocol):
    """What a partition write is handed to prove it still holds the partition (a `Lease`)."""

    @property
    def location(self) -> StateLocation:
        """The store the fence lives in (the ledger's: leases and warehouse pointers)."""
        ...

    def check(self) -> None:
        """Raise (the holder's error) unless this writer still holds it; renews it."""
        ...

    def fenced(self) -> AbstractContextManager[StateDatabase]:
        """A transaction on `location` in which this writer holds it, or the holder's error:
        what is committed inside it is committed by the holder only."""
        ...
