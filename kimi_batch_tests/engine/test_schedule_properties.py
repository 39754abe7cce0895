"""Properties of the prefix-aware schedule (`kimi_batch.engine.schedule.PrefixSchedule`) under
any interleaving of what the engine does with it: requests added (any ranks, kinds, texts and
work, at any time), lanes opened, lanes taking their next request (a lane that got None asks
again later, as a woken worker does), and queued requests withdrawn (a request promoted to a
lower rank is withdrawn and added again).

- Exactly once: every request added and not withdrawn is handed out once, never twice, never
  lost: draining the lanes at the end hands out all that is left, and `pending` and `total`
  count what is left at every step. A request withdrawn was still queued (in no lane) and is
  never handed out.
- A group never mixes two kinds (digests) nor two ranks: the request a lane is handed and the
  backlog it keeps share one kind and one rank.
- Rank: a lane is never handed a request of a higher rank than a queued one (the lowest rank
  first, also over a backlog taken before a lower rank was added).
- Back to back: a lane holding a backlog is handed its next request from it, unless a lower rank
  is queued; another lane's backlog only ever loses its back half (a steal), so a group's
  requests go to one lane in order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from kimi_batch.engine.schedule import Lane, PrefixSchedule, group_by_prefix, shared_prefix


@dataclass(frozen=True, eq=False)  # compared by identity, as the schedule's `withdraw` does
class Req:
    name: int
    text: str
    work: int
    rank: int
    kind: str


# Texts from a few shared leads (4 characters share a prefix at min_shared_chars=4), so groups
# of several requests form, and some texts repeat across kinds and ranks.
TEXTS = st.builds(
    lambda lead, tail: lead + tail,
    st.sampled_from(["", "aaaa", "aaaa", "aaab", "bbbb", "aaaaaaaa"]),
    st.text("ab", max_size=3),
)
# Few ranks and kinds, so one add often holds a group of several and a later add a lower rank.
SPECS = st.tuples(TEXTS, st.integers(0, 50), st.integers(0, 2), st.sampled_from(["", "", "x"]))
MAX_LANES = 4


class ScheduleMachine(RuleBasedStateMachine):
    queued = Bundle("queued")

    def __init__(self) -> None:
        super().__init__()
        self.names = 0
        self.schedule: PrefixSchedule[Req] = PrefixSchedule(
            text=lambda r: r.text,
            work=lambda r: r.work,
            rank=lambda r: r.rank,
            kind=lambda r: r.kind,
            min_shared_chars=4,
        )
        self.lanes: list[Lane[Req]] = []
        self.added: set[Req] = set()
        self.handed: set[Req] = set()
        self.withdrawn: set[Req] = set()

    # ---- what the engine does -----------------------------------------------------------------

    def _left(self) -> set[Req]:
        return self.added - self.handed - self.withdrawn

    def _in_lanes(self) -> set[Req]:
        return {item for lane in self.lanes for item in lane.current}

    def _queued_ranks(self) -> list[int]:
        return [item.rank for item in self._left() - self._in_lanes()]

    @rule(target=queued, specs=st.lists(SPECS, max_size=10))
    def add(self, specs: list[tuple[str, int, int, str]]) -> object:
        items = [Req(self.names + i, *spec) for i, spec in enumerate(specs)]
        self.names += len(items)
        self.schedule.add(items)
        self.added.update(items)
        return multiple(*items)

    @precondition(lambda self: len(self.lanes) < MAX_LANES)
    @rule()
    def open_lane(self) -> None:
        self.lanes.append(self.schedule.lane())

    @precondition(lambda self: bool(self.lanes))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.lanes) - 1))
        self._take(self.lanes[index])

    def _take(self, lane: Lane[Req]) -> Req | None:
        before = {id(other): list(other.current) for other in self.lanes}
        queued_ranks = self._queued_ranks()
        lowest_queued = min(queued_ranks, default=None)
        own = list(lane.current)
        item = lane.next()
        if item is None:
            # Nothing queued, and no other lane holds more than one request to steal from.
            assert not queued_ranks
            assert not own
            assert all(len(other.current) <= 1 for other in self.lanes)
            return None
        assert item not in self.handed, "handed out twice"
        assert item in self._left()
        self.handed.add(item)
        if lowest_queued is not None:
            assert item.rank <= lowest_queued, "a higher rank went before a queued lower one"
        if own and (lowest_queued is None or own[0].rank <= lowest_queued):
            assert item is own[0], "a backlog was left though no lower rank was queued"
            assert list(lane.current) == own[1:]
        # One group: one kind, one rank.
        group = [item, *lane.current]
        assert len({r.kind for r in group}) == 1
        assert len({r.rank for r in group}) == 1
        # Other lanes keep their backlog in order; a steal takes its back half, in order.
        for other in self.lanes:
            if other is lane:
                continue
            was, now = before[id(other)], list(other.current)
            assert now == was[: len(now)]
            if now != was:
                assert len(now) == len(was) - len(was) // 2
                assert group == was[len(now) :]
        return item

    @rule(item=consumes(queued))
    def withdraw(self, item: Req) -> None:
        in_queue = item in self._left() - self._in_lanes()
        assert self.schedule.withdraw(item) == in_queue
        if in_queue:
            self.withdrawn.add(item)

    # ---- what holds at every step --------------------------------------------------------------

    @invariant()
    def counts(self) -> None:
        assert self.schedule.pending == len(self._left())
        assert self.schedule.total == len(self.added) - len(self.withdrawn)

    def teardown(self) -> None:
        """Drain: whatever lanes there are plus a fresh one hand out all that is left."""
        self.lanes.append(self.schedule.lane())
        while any(self._take(lane) is not None for lane in list(self.lanes)):
            pass
        assert self.handed == self.added - self.withdrawn
        assert self.schedule.pending == 0


ScheduleMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_schedule_hands_out_every_request_once_by_rank_and_group = ScheduleMachine.TestCase


# ---- grouping ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(TEXTS, max_size=20), min_shared=st.integers(0, 6))
def test_grouping_is_a_partition_of_neighbours_in_input_order(
    texts: list[str], min_shared: int
) -> None:
    items = list(range(len(texts)))  # indexes: equal texts stay two items
    groups = group_by_prefix(items, text=texts.__getitem__, min_shared_chars=min_shared)
    assert sorted(i for group in groups for i in group) == items
    assert all(groups)
    # Groups come in the input order of their first item.
    assert [min(group) for group in groups] == sorted(min(group) for group in groups)
    for group in groups:
        ordered = [texts[i] for i in group]
        assert ordered == sorted(ordered)  # longest shared prefix first: sorted neighbours
        for a, b in itertools.pairwise(ordered):
            assert shared_prefix(a, b) >= min_shared
    # Neighbours in sort order are in one group exactly when they share enough.
    group_of = {i: g for g, group in enumerate(groups) for i in group}
    order = sorted(items, key=lambda i: (texts[i], i))
    for i, j in itertools.pairwise(order):
        shares = shared_prefix(texts[i], texts[j]) >= min_shared
        assert (group_of[i] == group_of[j]) == shares
