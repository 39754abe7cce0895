"""Prefix-aware scheduling: requests that share a long prefix run back to back on one slot.

llama-server reuses a slot's KV for the longest common prefix of the previous prompt and the next
one, so the k variants of one seed cost one seed prefill when they follow each other on the same
slot, and k prefills when they are dealt round-robin over the slots. The engine's workers (one
per endpoint slot) each hold a *lane*: a lane runs one group to the end, then takes the group
of the lowest rank (a night's oldest partition first; a group never spans two ranks) with the
most remaining work
(longest-processing-time first, so no slot is left with the tail of a big group while the
others idle), and when no group is left it steals the back half of the
largest group another lane still holds. Everything here is pure and single-threaded (asyncio
workers never interleave inside a call).
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
        min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
    ) -> None:
        self.work = work
        by_rank: dict[int, list[T]] = {}
        for item in items:
            by_rank.setdefault(rank(item), []).append(item)
        groups: list[list[T]] = []
        # A group never spans two ranks: a night's partitions stay in order even where their
        # prompts share a prefix (the same question asked in two partitions).
        for _, ranked in sorted(by_rank.items()):
            ranked_groups = group_by_prefix(ranked, text=text, min_shared_chars=min_shared_chars)
            # Stable sort: groups of equal work (all singletons, say) keep their input order.
            ranked_groups.sort(key=lambda group: -sum(work(item) for item in group))
            groups += ranked_groups
        self._groups: deque[deque[T]] = deque(deque(group) for group in groups)
        self._lanes: list[Lane[T]] = []
        self.total = len(items)

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
