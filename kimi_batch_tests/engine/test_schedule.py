"""Prefix grouping and lane hand-out (pure: no server)."""

from __future__ import annotations

from kimi_batch.engine.schedule import PrefixSchedule, group_by_prefix, shared_prefix

SEED_A = "A" * 200
SEED_B = "B" * 200


def _variants(seed: str) -> list[str]:
    return [f"{seed}|{strategy}|v{i}" for strategy in ("harder", "para") for i in (1, 2)]


def test_shared_prefix_counts_leading_characters() -> None:
    assert shared_prefix("abcdef", "abcxyz") == 3
    assert shared_prefix("", "abc") == 0


def test_groups_collect_each_seeds_variants_longest_shared_prefix_first() -> None:
    # Interleaved the way a round-robin client would see them.
    items = [x for pair in zip(_variants(SEED_B), _variants(SEED_A), strict=True) for x in pair]

    groups = group_by_prefix(items, text=str, min_shared_chars=128)

    # B's first variant came first in the input, so B's group does too.
    assert groups == [sorted(_variants(SEED_B)), sorted(_variants(SEED_A))]
    # Inside a group, one strategy's variants are neighbours.
    assert [g.split("|")[1] for g in groups[0]] == ["harder", "harder", "para", "para"]


def test_requests_sharing_only_a_short_lead_keep_their_input_order() -> None:
    items = ["Question: zeta", "Question: alpha", "Question: mid"]

    assert group_by_prefix(items, text=str, min_shared_chars=128) == [[x] for x in items]


def _drain(schedule: PrefixSchedule[str], lanes: int) -> list[list[str]]:
    """Round-robin over lanes, one request per turn, as equally fast slots would take them."""
    handles = [schedule.lane() for _ in range(lanes)]
    taken: list[list[str]] = [[] for _ in range(lanes)]
    active = set(range(lanes))
    while active:
        for index in sorted(active):
            item = handles[index].next()
            if item is None:
                active.discard(index)
            else:
                taken[index].append(item)
    return taken


def test_each_group_runs_on_one_lane_largest_group_first() -> None:
    small = [f"{'C' * 200}|{i}" for i in range(2)]
    items = [*small, *_variants(SEED_A), *_variants(SEED_B)]
    schedule = PrefixSchedule(items, text=str, work=lambda _: 10)

    lanes = _drain(schedule, 3)

    # The two 4-request groups go first, one per lane; the 2-request group to the third lane.
    assert lanes == [sorted(_variants(SEED_A)), sorted(_variants(SEED_B)), small]
    assert schedule.pending == 0


def test_an_idle_lane_steals_the_back_half_of_the_largest_backlog() -> None:
    one_group = [f"{SEED_A}|{i:02d}" for i in range(8)]
    schedule = PrefixSchedule(one_group, text=str, work=lambda _: 10)

    lanes = _drain(schedule, 2)

    # No lane idles while the other holds a queue, and each half stays in prefix order.
    assert lanes[0] == one_group[:5]
    assert lanes[1] == one_group[5:]


def test_a_lower_rank_is_handed_out_first_whatever_its_work() -> None:
    # A night: partition 0's short requests before partition 1's long ones.
    old = [f"old question {i}" for i in range(3)]
    new = [f"new question {i}" for i in range(3)]
    rank = {**dict.fromkeys(old, 0), **dict.fromkeys(new, 1)}
    work = {**dict.fromkeys(old, 10), **dict.fromkeys(new, 1000)}
    schedule = PrefixSchedule([*new, *old], text=str, work=work.__getitem__, rank=rank.__getitem__)

    lane = schedule.lane()
    order = [lane.next() for _ in range(6)]

    assert order == [*old, *new]
    assert lane.next() is None


def test_requests_sharing_a_prefix_across_ranks_stay_in_rank_order() -> None:
    # The same long question in three partitions: three groups, oldest partition first.
    items = [f"{SEED_A}|partition {p}" for p in (2, 0, 1)]
    rank = {item: int(item[-1]) for item in items}
    schedule = PrefixSchedule(items, text=str, work=lambda _: 10, rank=rank.__getitem__)

    lanes = _drain(schedule, 3)

    assert [lane[0][-1] for lane in lanes] == ["0", "1", "2"]


def test_requests_added_later_join_by_rank_behind_their_own_rank() -> None:
    rank = {"a0": 0, "c0": 2, "b0": 1, "b1": 1, "a1": 0}
    schedule = PrefixSchedule(["b0", "c0"], text=str, work=lambda _: 10, rank=rank.__getitem__)
    lane = schedule.lane()
    first = lane.next()

    schedule.add(["b1", "a0"])
    schedule.add(["a1"])

    assert first == "b0"
    assert [lane.next() for _ in range(4)] == ["a0", "a1", "b1", "c0"]
    assert lane.next() is None


def test_a_backlog_gives_way_to_a_lower_rank_added_after_it_was_taken() -> None:
    # A newer partition's one big group, split between two lanes; then an older partition's
    # next stage arrives.
    newer = [f"{SEED_A}|{i:02d}" for i in range(8)]
    older = [f"older question {i}" for i in range(2)]  # two groups: nothing shared
    rank = {**dict.fromkeys(newer, 1), **dict.fromkeys(older, 0)}
    schedule = PrefixSchedule(newer, text=str, work=lambda _: 10, rank=rank.__getitem__)
    first, second = schedule.lane(), schedule.lane()
    started = [first.next(), second.next()]  # second steals the back half

    schedule.add(older)
    taken = [first.next(), second.next()]
    rest = _drain(schedule, 2)

    assert started == [newer[0], newer[5]]
    assert taken == older  # at the next request of each lane, not at the end of its backlog
    # The backlogs went back to the queue: each of their requests is handed out once.
    assert sorted(x for lane in rest for x in lane) == newer[1:5] + newer[6:]
