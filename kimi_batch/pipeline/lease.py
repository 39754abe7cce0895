"""The partition's lease: one run at a time generates and writes a partition's tables."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kimi_batch.engine import Lease, LeaseHeldError, LeaseLostError, Ledger
from kimi_batch.pipeline.errors import PartitionSkippedError

# A lease lives this long without its holder's heartbeat: a killed run frees its partition then.
LEASE_TTL_S = 60.0
# A second run on the same partition waits this long, longer than a dead holder's lease can last,
# then leaves a live holder the partition (it writes every row; a second run would only repeat).
LEASE_WAIT_S = LEASE_TTL_S + 30.0


@dataclass(frozen=True)
class HeldPartition:
    """The ledger, and the lease this run holds on the partition: the fence of every Parquet
    write (`guard=held.lease`), `check` before the other writes."""

    ledger: Ledger
    lease: Lease

    def check(self) -> None:
        """Raises LeaseLostError when another run has taken the partition over."""
        self.lease.check()


@contextmanager
def partition_lease(
    ledgers: Callable[[], Ledger], ds: str, source: str, holder: str
) -> Iterator[HeldPartition]:
    """Hold the partition (generation and every write of its tables) for run `holder`, on a
    ledger `ledgers()` opens; a partition another run holds, or a lease lost on the way (this
    run stalled past its ttl), is `PartitionSkippedError` instead of a write."""
    with ledgers() as ledger:
        lease = ledger.lease(f"{ds}|{source}", holder, ttl_s=LEASE_TTL_S, wait_s=LEASE_WAIT_S)
        try:
            held = lease.__enter__()
        except LeaseHeldError as error:
            raise PartitionSkippedError(
                f"partition {ds}|{source} is being written by another run ({error}); "
                "this run leaves it alone"
            ) from error
        try:
            yield HeldPartition(ledger=ledger, lease=held)
        except LeaseLostError as error:
            raise PartitionSkippedError(str(error)) from error
        finally:
            lease.__exit__(None, None, None)
