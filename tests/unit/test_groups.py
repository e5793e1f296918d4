"""Consumer groups across queues: the summary status shows, and deleting an app's group."""

from __future__ import annotations

import pytest

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform.balancing.leases import MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo, MemoryMembership
from conveyor.platform.errors import AppAliveError, UnknownGroupError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message
from conveyor.platform.operations.groups import (
    GroupInfo,
    delete_app_group,
    queue_ranges,
    summarise,
    with_retention_holders,
)


def test_queue_lists_are_written_as_ranges() -> None:
    assert queue_ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert queue_ranges([]) == ""


def test_retention_waits_for_the_group_needing_the_oldest_message_ties_included() -> None:
    infos = [GroupInfo("a", 0, 3, oldest_needed=SequenceToken(0, 7)),
             GroupInfo("b", 0, 0),  # needs nothing kept
             GroupInfo("c", 0, 9, oldest_needed=SequenceToken(0, 2)),
             GroupInfo("d", 0, 9, oldest_needed=SequenceToken(0, 2))]
    assert [i.group for i in with_retention_holders(infos) if i.holds_retention] == ["c", "d"]
    assert with_retention_holders(infos[1:2]) == infos[1:2]


def test_the_summary_folds_queues_into_one_row_per_group() -> None:
    rows = summarise([
        GroupInfo("live", 0, 2, idle_s=0.5, oldest_needed_ms=900),
        GroupInfo("ghost", 0, 10, oldest_needed_ms=100, holds_retention=True),
        GroupInfo("live", 1, 3, idle_s=0.2),
        GroupInfo("ghost", 1, 4, oldest_needed_ms=50, holds_retention=True),
    ])
    ghost, live = rows
    assert (ghost.group, ghost.queues, ghost.lag, ghost.idle_s) == ("ghost", [0, 1], 14, None)
    assert (ghost.holds_retention, ghost.oldest_needed_ms) == ([0, 1], 50)
    assert (live.lag, live.idle_s, live.members, live.holds_retention) == (5, 0.2, None, [])


@pytest.fixture
async def adapter() -> MemoryAdapter:
    reset_broker("groups")
    a = MemoryAdapter("groups")
    await a.enqueue(0, [Message("m", StreamId("ns", "k"), b"1")])
    await a.rewind_queues([0], "old", 0.0, create_group=True)
    return a


async def test_deleting_an_app_that_looks_alive_is_refused_unless_forced(
    adapter: MemoryAdapter,
) -> None:
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    await membership.join(MemberInfo("d-1", "h", 1, 0.0))
    await leases.acquire(0, "d-1", 30)
    with pytest.raises(AppAliveError, match=r"daemon\(s\) d-1 registered; leases held on "
                                            r"queue\(s\) 0.*: stop its workers first$"):
        await delete_app_group(adapter, membership, leases, "old", [0, 1])
    assert await adapter.groups.has([0], "old")
    assert await delete_app_group(adapter, membership, leases, "old", [0, 1], force=True) == [0]
    assert not await adapter.groups.has([0, 1], "old")


async def test_deleting_an_app_with_no_group_is_refused_and_deletes_nothing(
    adapter: MemoryAdapter,
) -> None:
    await adapter.dead_letters.put("olf", [])
    with pytest.raises(UnknownGroupError, match=r"'olf' has no consumer group.*nothing was"):
        await delete_app_group(adapter, MemoryMembership(), MemoryLeaseStore(), "olf", [0],
                               dead_letters=True)
    assert "olf" in adapter.broker.dead_letters and await adapter.groups.has([0], "old")
