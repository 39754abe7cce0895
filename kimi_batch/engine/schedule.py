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
another lane still holds. Everything here is pure and single-threaded (asyncio workers never
interleave inside a call).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["DEFAULT_MIN_SHARED_CHARS", "Lane", "PrefixSchedule", "group_by_prefix", "shared_prefix"]

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
        """The next request for this slot, or None when the whole batch is handed out."""
        if not self.current:
            self.current = self._schedule.take_group(self)
        return self.current.popleft() if self.current else None


class PrefixSchedule(Generic[T]):
    """Hands out groups of prefix-sharing requests to lanes, largest remaining work first."""

    def __init__(
        self,
        items: Sequence[T],
        *,
        text: Callable[[T], str],
        work: Callable[[T], int],
        rank: Callable[[T], int] = lambda _item: 0,
        kind: Callable[[T], str] = lambda _item: "",
        min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
    ) -> None:
        self.work = work
        by_rank: dict[int, dict[str, list[T]]] = {}
        for item in items:
            by_rank.setdefault(rank(item), {}).setdefault(kind(item), []).append(item)
        groups: list[list[T]] = []
        groups_of_kind: dict[str, int] = {}
        # A group never spans two ranks: a night's partitions stay in order even where their
        # prompts share a prefix (the same question asked in two partitions).
        for _, kinds in sorted(by_rank.items()):
            blocks: list[list[list[T]]] = []
            for name, kind_items in kinds.items():
                block = group_by_prefix(kind_items, text=text, min_shared_chars=min_shared_chars)
                # Stable sort: groups of equal work (all singletons, say) keep their input order.
                block.sort(key=lambda group: -sum(work(item) for item in group))
                blocks.append(block)
                groups_of_kind[name] = groups_of_kind.get(name, 0) + len(block)
            # The kind whose largest group is largest first: LPT across kinds as within one.
            blocks.sort(key=lambda block: -sum(work(item) for item in block[0]))
            groups += [group for block in blocks for group in block]
        self._groups: deque[deque[T]] = deque(deque(group) for group in groups)
        self._lanes: list[Lane[T]] = []
        self.total = len(items)
        # Consecutive groups go to different lanes: a kind of several groups runs on several
        # slots (worth bringing its digest in once and copying it), a kind of one group on one.
        self.shared_kinds = frozenset(name for name, n in groups_of_kind.items() if n > 1)

    def lane(self) -> Lane[T]:
        lane = Lane(self)
        self._lanes.append(lane)
        return lane

    @property
    def pending(self) -> int:
        """Requests not yet handed to a worker (queued groups and lanes' backlogs)."""
        return sum(len(g) for g in self._groups) + sum(len(lane.current) for lane in self._lanes)

    def take_group(self, taker: Lane[T]) -> deque[T]:
        if self._groups:
            return self._groups.popleft()
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
