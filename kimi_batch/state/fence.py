"""A fence: proof that a writer still holds what it writes, checked where the write commits.

A partition lease is renewed by a heartbeat, but a holder can stall (swapped out, a VM paused)
between checking its lease and committing its write, and wake after another run took the
partition over. A check before the commit leaves that gap; a fence closes it: `fenced()` opens a
transaction on the lease's store, holding the store's write lock, in which the lease is confirmed
(and renewed), and the caller commits its write inside it. Taking a lease needs the same write
lock, so nobody takes the partition over until the write is committed. A write that commits in a
transaction of its own on the same database (an Iceberg catalog commit) hands that transaction's
connection to `confirm_in` instead, so the lease is confirmed in the commit itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from kimi_batch.state.database import StateDatabase


class Fence(Protocol):
    """What a partition write is handed to prove it still holds the partition (a `Lease`)."""

    def fenced(self) -> AbstractContextManager[StateDatabase]:
        """A transaction on the lease's store in which this writer holds it, or the holder's
        error (LeaseLostError): what is committed inside it is committed by the holder only."""
        ...

    def confirm_in(self, db: StateDatabase) -> None:
        """Confirm (and renew) the lease on `db`, a connection inside a transaction that is
        about to commit a write: the store's write lock is taken first, so the write commits
        only if this writer holds the lease at that moment (LeaseLostError otherwise)."""
        ...
