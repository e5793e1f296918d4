"""The dynamic balancer's split: even, deterministic, and moving only what must move."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from conveyor.platform.balancing.balancer import sticky_split

member_ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=7,
                      unique=True)


@st.composite
def views(draw: st.DrawFn) -> tuple[list[str], int, dict[int, str]]:
    """Members, a queue count, and lease holders: members, departed daemons, or nobody."""
    members = draw(member_ids)
    total = draw(st.integers(0, 40))
    holders = st.sampled_from([*members, "gone-1", "gone-2"])
    owners = draw(st.dictionaries(st.integers(0, max(total - 1, 0)), holders))
    return members, total, {q: m for q, m in owners.items() if q < total}


def held(members: list[str], owners: dict[int, str]) -> dict[str, set[int]]:
    return {m: {q for q, o in owners.items() if o == m} for m in members}


@given(views())
def test_every_queue_goes_to_exactly_one_member_and_shares_differ_by_at_most_one(
    view: tuple[list[str], int, dict[int, str]],
) -> None:
    members, total, owners = view
    split = sticky_split(members, total, owners)
    assert set(split) == set(members)
    assigned = sorted(q for qs in split.values() for q in qs)
    assert assigned == list(range(total))
    assert {len(qs) for qs in split.values()} <= {total // len(members),
                                                   -(-total // len(members))}
    assert all(qs == sorted(qs) for qs in split.values())


@given(views(), st.randoms())
def test_every_daemon_computes_the_same_split_whatever_order_it_reads_the_view_in(
    view: tuple[list[str], int, dict[int, str]], rnd: random.Random,
) -> None:
    members, total, owners = view
    shuffled_members = list(members)
    items = list(owners.items())
    rnd.shuffle(shuffled_members)
    rnd.shuffle(items)
    assert sticky_split(shuffled_members, total, dict(items)) == sticky_split(
        members, total, owners)


@given(views())
def test_no_even_split_keeps_more_queues_with_their_owners(
    view: tuple[list[str], int, dict[int, str]],
) -> None:
    members, total, owners = view
    split = sticky_split(members, total, owners)
    holding = held(members, owners)
    kept = sum(len(holding[m] & set(split[m])) for m in members)
    # The best any even split can do, counted independently: each member keeps at most
    # its share; the q mod n larger shares help only members holding more than floor.
    base, larger = divmod(total, len(members))
    best = sum(min(len(h), base) for h in holding.values())
    best += min(larger, sum(1 for h in holding.values() if len(h) > base))
    assert kept == best
    # And a member holding no more than the smaller share loses nothing.
    for m in members:
        if len(holding[m]) <= base:
            assert holding[m] <= set(split[m])


@given(views())
def test_once_handed_over_the_split_is_settled(
    view: tuple[list[str], int, dict[int, str]],
) -> None:
    """When every daemon holds its share, the next re-balance moves nothing (no churn)."""
    members, total, owners = view
    split = sticky_split(members, total, owners)
    settled = {q: m for m, qs in split.items() for q in qs}
    assert sticky_split(members, total, settled) == split


@given(st.integers(1, 6), st.integers(0, 40))
def test_a_join_or_a_leave_moves_only_the_surplus(n: int, total: int) -> None:
    members = [f"m{i}" for i in range(n)]
    start = sticky_split(members, total, {})
    owners = {q: m for m, qs in start.items() for q in qs}
    joined = sticky_split([*members, "new"], total, owners)
    moved_in = sum(1 for q, m in owners.items() if q not in joined[m])
    assert moved_in == len(joined["new"]) == total // (n + 1)
    owners = {q: m for m, qs in joined.items() for q in qs}
    left = sticky_split(members, total, owners)  # the new one leaves again
    moved_out = sum(1 for q, m in owners.items() if m == "new" or q not in left[m])
    assert moved_out == len(joined["new"])


def test_three_to_four_to_three_daemons_over_eight_queues_moves_two_each_way() -> None:
    three = sticky_split(["a", "b", "c"], 8, {})
    assert three == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    owners = {q: m for m, qs in three.items() for q in qs}
    four = sticky_split(["a", "b", "c", "d"], 8, owners)
    assert four == {"a": [0, 1], "b": [3, 4], "c": [6, 7], "d": [2, 5]}
    owners = {q: m for m, qs in four.items() for q in qs}
    back = sticky_split(["a", "b", "c"], 8, owners)
    assert back == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}


def test_queues_of_a_departed_holder_go_to_the_members_short_of_their_share() -> None:
    owners = {0: "a", 1: "a", 2: "ghost", 3: "b", 4: "ghost"}
    # "a" holds more, so it gets the larger share: both keep everything they hold.
    assert sticky_split(["a", "b"], 5, owners) == {"a": [0, 1, 2], "b": [3, 4]}
    assert sticky_split([], 5, owners) == {}
