"""The memory adapter's own behaviour; the port's promises are in tests/contract/."""

import asyncio

import pytest

from conveyor.adapters.memory import TRIM_EVERY, MemoryAdapter, reset_broker
from conveyor.platform.errors import ForwardRewindError, InvalidArgumentError, UnknownGroupError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message


def make(n: int, start: int = 0, ts: int = 0) -> list[Message]:
    return [
        Message(f"m{i}", StreamId("ns", "k"), str(i).encode(), enqueued_at_ms=ts)
        for i in range(start, start + n)
    ]


@pytest.fixture
def adapter() -> MemoryAdapter:
    reset_broker("unit")
    return MemoryAdapter("unit")


def bodies(msgs: list[Message]) -> list[int]:
    return [int(m.body) for m in msgs]


async def test_messages_acknowledged_out_of_queue_order_are_done_singly(
    adapter: MemoryAdapter,
) -> None:
    await adapter.enqueue(0, make(6))
    first = adapter.create_receiver(0, "g")
    got = await first.get_messages(4)
    await first.acknowledge([got[0].token, got[2].token])  # type: ignore[list-item]
    await first.shutdown()
    second = adapter.create_receiver(0, "g")
    await second.initialize()
    assert bodies(await second.get_messages(10)) == [1, 3, 4, 5]


async def test_retention_trims_only_what_every_group_acknowledged(
    adapter: MemoryAdapter,
) -> None:
    fast, slow = adapter.create_receiver(0, "fast"), adapter.create_receiver(0, "slow")
    await adapter.enqueue(0, make(10))
    got = await fast.get_messages(10)
    await fast.acknowledge([m.token for m in got if m.token])
    await slow.get_messages(3)  # delivered, never acked
    await adapter.enqueue(0, make(TRIM_EVERY, start=10))  # triggers a trim
    log = adapter.broker.logs[0]
    assert log.base == 0  # the slow group still holds message 0
    await slow.shutdown()
    rx = adapter.create_receiver(0, "slow")
    assert bodies(await rx.get_messages(3)) == [0, 1, 2]
    all_slow = await rx.get_messages(TRIM_EVERY + 10)
    await rx.acknowledge([SequenceToken(0, i) for i in range(3)])
    await rx.acknowledge([m.token for m in all_slow if m.token])
    more = await fast.get_messages(TRIM_EVERY)
    await fast.acknowledge([m.token for m in more if m.token])
    adapter.broker.trim()
    assert log.base == TRIM_EVERY + 10 and log.items == []


async def test_empty_polls_on_an_idle_queue_leave_no_waiters_behind(
    adapter: MemoryAdapter,
) -> None:
    rx = adapter.create_receiver(3, "g")
    await rx.initialize()
    for _ in range(200):
        assert await rx.get_messages(10, timeout_s=0.0001) == []
    assert adapter.broker.log(3).waiters == []
    # A cancelled poll (a shutting-down agent) leaves none either.
    poll = asyncio.ensure_future(rx.get_messages(10, timeout_s=30))
    await asyncio.sleep(0)
    assert len(adapter.broker.log(3).waiters) == 1
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    assert adapter.broker.log(3).waiters == []
    # And a waiting poll is still woken by an enqueue.
    poll = asyncio.ensure_future(rx.get_messages(10, timeout_s=30))
    await asyncio.sleep(0)
    await adapter.enqueue(3, make(2))
    assert bodies(await asyncio.wait_for(poll, 5)) == [0, 1]
    assert adapter.broker.log(3).waiters == []


async def test_a_forward_rewind_counts_the_taken_messages_a_rewind_would_drop(
    adapter: MemoryAdapter,
) -> None:
    """Memory forgets taken messages when it moves a position: they count as skipped."""
    await adapter.enqueue(0, make(10))
    await adapter.enqueue(1, make(10))
    rx = adapter.create_receiver(0, "g")
    await rx.initialize()
    got = await rx.get_messages(4)  # 0..3 taken; 0 and 1 acked, 2 and 3 still pending
    await rx.acknowledge([m.token for m in got[:2] if m.token])
    await rx.shutdown()
    # Back (or to where it stands) skips nothing; ahead skips the unfinished ones below.
    assert await adapter.forward_gap(0, "g", SequenceToken(0, 1)) == 0
    assert await adapter.forward_gap(0, "g", SequenceToken(0, 7)) == 5  # 2..6
    with pytest.raises(ForwardRewindError, match=r"queue 0: 8 message.*queue 1: 10 message"):
        await adapter.rewind_queues([0, 1], "g", 9_999.0)  # after the last message
    # Checked on every queue before any moved: queue 1 (never read) is untouched too.
    assert await adapter.lag(0, "g") == 8 and await adapter.lag(1, "g") == 10
    await adapter.rewind_queues([0], "g", SequenceToken(0, 7), allow_forward=True)
    assert await adapter.lag(0, "g") == 3


async def test_rewinding_an_app_with_no_group_is_refused_and_creates_none(
    adapter: MemoryAdapter,
) -> None:
    await adapter.enqueue(0, make(5))
    await adapter.enqueue(1, make(5))
    live = adapter.create_receiver(0, "live")
    await live.acknowledge([m.token for m in await live.get_messages(5) if m.token])
    # Reading a ghost's lag or gap creates no group either (status and rewind read them).
    assert await adapter.lag(1, "ghost") == 5 and await adapter.forward_gap(1, "ghost", 0.0) == 0
    with pytest.raises(UnknownGroupError, match=r"'ghost' has no consumer group on queue\(s\) "
                                                r"0-1.*--create-group"):
        await adapter.rewind_queues([0, 1], "ghost", 0.0)
    assert {g for g, _ in adapter.broker.cursors} == {"live"}
    await adapter.rewind_queues([0, 1], "ghost", 0.0, create_group=True)
    assert await adapter.lag(0, "ghost") == 5 and await adapter.lag(1, "ghost") == 5
    assert {q for g, q in adapter.broker.cursors if g == "ghost"} == {0, 1}
    await live.shutdown()  # a queue still owned is refused, whatever the group
    await adapter.rewind_queues([0], "live", 0.0)  # an app with a group needs no flag


async def test_the_group_nobody_runs_holds_retention_until_it_is_deleted(
    adapter: MemoryAdapter,
) -> None:
    await adapter.enqueue(0, make(10, ts=5_000))
    live = adapter.create_receiver(0, "live")
    await live.acknowledge([m.token for m in await live.get_messages(10) if m.token])
    await adapter.rewind_queues([0], "ghost", 0.0, create_group=True)
    await adapter.dead_letters.put("ghost", [])
    adapter.broker.trim()
    assert adapter.broker.log(0).base == 0  # the ghost still needs message 0
    ghost_info, live_info = await adapter.groups.on([0, 1])  # by name; queue 1: nobody there
    assert (live_info.group, live_info.lag, live_info.holds_retention) == ("live", 0, False)
    assert live_info.oldest_needed is None  # it needs nothing kept
    assert (ghost_info.group, ghost_info.lag, ghost_info.holds_retention) == ("ghost", 10, True)
    assert ghost_info.oldest_needed == SequenceToken(0, 0)
    assert ghost_info.oldest_needed_ms == 5_000
    assert await adapter.groups.has([1], "ghost") is False
    assert await adapter.groups.delete("ghost", [0, 1]) == [0]
    assert "ghost" in adapter.broker.dead_letters  # kept unless asked
    adapter.broker.trim()
    assert adapter.broker.log(0).base == 10  # trimming resumed
    assert [g.group for g in await adapter.groups.on([0])] == ["live"]
    await adapter.rewind_queues([0], "ghost", 0.0, create_group=True)
    await adapter.groups.delete("ghost", [0], dead_letters=True)
    assert "ghost" not in adapter.broker.dead_letters


@pytest.mark.parametrize("letter_id", ["x", "", "-1", "\u00b2", "\u0663"])
async def test_a_letter_id_that_is_not_ascii_digits_is_refused_as_such(
    adapter: MemoryAdapter, letter_id: str
) -> None:
    # A superscript two passed str.isdigit and failed int() as a ValueError traceback;
    # an Arabic-Indic three was read as letter 3.
    with pytest.raises(InvalidArgumentError, match="not a dead-letter id of the memory"):
        await adapter.dead_letters.find("app", letter_id)
    with pytest.raises(InvalidArgumentError, match="not a dead-letter id of the memory"):
        await adapter.dead_letters.delete("app", [letter_id])
