"""Prefix-aware scheduling: requests that share a long prefix run back to back on one slot.

llama-server reuses a slot's KV for the longest common prefix of the previous prompt and the next
one, so the k variants of one seed cost one seed prefill when they follow each other on the same
slot, and k prefills when they are dealt round-robin over the slots. Requests are grouped by
their *kind* first (the system digest they start with: a group never mixes two), then by shared
prefix. The engine's workers (one per endpoint slot) each hold a *lane*: a lane runs one group to
the end, then takes the next group of the lowest rank (a night's oldest partition first; a group
never spans two ranks). Within a rank one kind's groups are queued together, so the slots run
one digest at a time and each brings it in once; kinds and the groups inside one go by most
remaining work (longest-processing-time first, so no slot is left with the tail of a big group
while the others idle). When no group is left a lane steals the back half of the largest group
another lane still holds. Requests added later (`PrefixSchedule.add`: a night's next stage of a
partition) join the queue by rank, and a lane whose backlog has a higher rank puts it back for
them at its next request. Everything here is pure and single-threaded (asyncio workers never
interleave inside a call).
"""

from __future__ import annotations

import bisect
import os
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

# ~32 tokens: below that a shared lead saves less than the order it costs.
DEFAULT_MIN_SHARED_CHARS = 128


def shared_prefix(a: str, b: str) -> int:
    """Length in characters of the common prefix of two strings."""
    # Characters are what we want here (not path components): a cheap stand-in for tokens.
    return len(os.path.commonprefix([a, b]))  # noqa: RUF071


def group_by_prefix(
    items: Sequence[T],
    *,
    text: Callable[[T], str],
    min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
) -> list[list[T]]:
    """Groups of items whose texts share at least `min_shared_chars` leading characters.

    Sorting the texts puts every item next to the one it shares the longest prefix with (the
    common prefix of two sorted strings bounds that of everything between them), so a group is a
    run of neighbours and its order is already "longest shared prefix first". Groups come in the
    input order of their first item; an item sharing nothing is a group of one, so a batch
    without shared prefixes keeps its input order.
    """
    order = sorted(range(len(items)), key=lambda i: (text(items[i]), i))
    groups: list[list[int]] = []
    previous = ""
    for index in order:
        current = text(items[index])
        if groups and shared_prefix(previous, current) >= min_shared_chars:
            groups[-1].append(index)
        else:
            groups.append([index])
        previous = current
    groups.sort(key=min)
    return [[items[i] for i in group] for group in groups]


class Lane(Generic[T]):
    """The work queue of one worker (one slot of one endpoint)."""

    def __init__(self, schedule: PrefixSchedule[T]) -> None:
        self._schedule = schedule
        self.current: deque[T] = deque()

    @property
    def remaining_work(self) -> int:
        return sum(self._schedule.work(item) for item in self.current)

    def next(self) -> T | None:
        """The next request for this slot, or None when nothing is queued or left to steal.

        A backlog gives way to a lower rank queued since it was taken (a night's older
        partition whose next stage was just added): it goes back to the queue, first of its
        rank, and the lower rank goes next, without waiting for the backlog's end."""
        if self.current and self._schedule.outranked(self.current[0]):
            self._schedule.put_back(self.current)
            self.current = deque()
        if not self.current:
            self.current = self._schedule.take_group(self)
        return self.current.popleft() if self.current else None


class PrefixSchedule(Generic[T]):
    """Hands out groups of prefix-sharing requests to lanes, the lowest rank first and, within a
    rank, the largest remaining work first. More requests may be added while lanes take from it
    (`add`): their groups go in by rank, behind the queued groups of the same rank."""

    def __init__(
        self,
        items: Sequence[T] = (),
        *,
        text: Callable[[T], str],
        work: Callable[[T], int],
        rank: Callable[[T], int] = lambda _item: 0,
        kind: Callable[[T], str] = lambda _item: "",
        min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
    ) -> None:
        self.text = text
        self.work = work
        self.rank = rank
        self.kind = kind
        self.min_shared_chars = min_shared_chars
        # Queued groups in hand-out order, each with its rank (a group never spans two ranks).
        self._groups: list[tuple[int, deque[T]]] = []
        self._lanes: list[Lane[T]] = []
        self._groups_of_kind: Counter[str] = Counter()
        self.total = 0
        self.add(items)

    @property
    def shared_kinds(self) -> frozenset[str]:
        """The kinds of more than one group so far. Consecutive groups go to different lanes: a
        kind of several groups runs on several slots (worth bringing its digest in once and
        copying it), a kind of one group on one."""
        return frozenset(name for name, n in self._groups_of_kind.items() if n > 1)

    def is_shared(self, kind: str) -> bool:
        """Whether `kind` is one of `shared_kinds`."""
        return self._groups_of_kind[kind] > 1

    def add(self, items: Sequence[T]) -> None:
        """Queue `items`: grouped by kind, then by shared prefix, within each rank; each rank's
        groups behind the queued groups of a lower or equal rank and ahead of the higher ones."""
        by_rank: dict[int, dict[str, list[T]]] = {}
        for item in items:
            by_rank.setdefault(self.rank(item), {}).setdefault(self.kind(item), []).append(item)
        # A group never spans two ranks: a night's partitions stay in order even where their
        # prompts share a prefix (the same question asked in two partitions).
        for rank, kinds in sorted(by_rank.items()):
            blocks = [self._kind_groups(name, kind_items) for name, kind_items in kinds.items()]
            # The kind whose largest group is largest first: LPT across kinds as within one.
            blocks.sort(key=lambda block: -sum(self.work(item) for item in block[0]))
            at = bisect.bisect_right(self._groups, rank, key=lambda queued: queued[0])
            self._groups[at:at] = [(rank, deque(group)) for block in blocks for group in block]
        self.total += len(items)

    def _kind_groups(self, name: str, items: list[T]) -> list[list[T]]:
        """One kind's items of one rank by shared prefix, the most work first."""
        groups = group_by_prefix(items, text=self.text, min_shared_chars=self.min_shared_chars)
        # Stable sort: groups of equal work (all singletons, say) keep their input order.
        groups.sort(key=lambda group: -sum(self.work(item) for item in group))
        self._groups_of_kind[name] += len(groups)
        return groups

    def withdraw(self, item: T) -> bool:
        """Take `item` out of the queued groups (not out of a lane); False when none holds it."""
        for index, (_, group) in enumerate(self._groups):
            at = next((i for i, queued in enumerate(group) if queued is item), None)
            if at is not None:
                del group[at]
                if not group:
                    del self._groups[index]
                self.total -= 1
                return True
        return False

    def outranked(self, item: T) -> bool:
        """Whether a queued group has a lower rank than `item`'s."""
        return bool(self._groups) and self._groups[0][0] < self.rank(item)

    def put_back(self, backlog: deque[T]) -> None:
        """A lane's backlog back in the queue, ahead of the queued groups of its rank."""
        rank = self.rank(backlog[0])
        at = bisect.bisect_left(self._groups, rank, key=lambda queued: queued[0])
        self._groups.insert(at, (rank, backlog))

    def lane(self) -> Lane[T]:
        lane = Lane(self)
        self._lanes.append(lane)
        return lane

    @property
    def pending(self) -> int:
        """Requests not yet handed to a worker (queued groups and lanes' backlogs)."""
        return sum(len(g) for _, g in self._groups) + sum(len(lane.current) for lane in self._lanes)

    def take_group(self, taker: Lane[T]) -> deque[T]:
        if self._groups:
            return self._groups.pop(0)[1]
        # Nothing queued: steal the back half of the largest backlog, so the victim keeps the
        # part that continues its KV and the thief's half still shares its prefix in order.
        victim = max(
            (lane for lane in self._lanes if lane is not taker and len(lane.current) > 1),
            key=lambda lane: lane.remaining_work,
            default=None,
        )
        if victim is None:
            return deque()
        keep = len(victim.current) - len(victim.current) // 2
        stolen: deque[T] = deque()
        while len(victim.current) > keep:
            stolen.appendleft(victim.current.pop())
        return stolen
