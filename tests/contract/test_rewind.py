"""Rewinding: back to a token or a time; the port's checks, the same on every adapter."""

from __future__ import annotations

import time

import pytest

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.errors import (
    BrokerError,
    ForwardRewindError,
    QueueOwnedError,
    TokenRangeError,
)
from conveyor.platform.ids import SequenceToken
from tests.conftest import wait_until
from tests.contract.conftest import Open
from tests.contract.support import numbered, numbers, take_and_ack, take_rest


async def past(moment: float) -> None:
    """Wait until the clock is safely past ``moment`` (stream ids count milliseconds)."""
    await wait_until(lambda: time.time() > moment + 0.01, 5, what="the clock to move on")


async def two_batches_and_a_time_between(adapter: QueueAdapter, *queues: int) -> float:
    """Messages 0..4 on each queue, then a moment, then 5..9 (enqueued with their time)."""
    for queue in queues:
        await adapter.enqueue(queue, numbered(range(5), stamp=True))
    await past(time.time())
    between = time.time()
    await past(between)
    for queue in queues:
        await adapter.enqueue(queue, numbered(range(5, 10), stamp=True))
    return between


async def test_rewinding_to_a_token_redelivers_from_that_message_on(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    sent = await adapter.enqueue(0, numbered(range(10)))
    done = await open_receiver(0, "app")
    await take_and_ack(done, 10)
    await done.shutdown()
    await adapter.rewind_queues([0], "app", sent[6])
    assert await adapter.lag(0, "app") == 4
    assert numbers(await take_rest(await open_receiver(0, "app"), 4)) == [6, 7, 8, 9]


async def test_rewinding_to_a_time_redelivers_what_was_enqueued_from_then_on(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    between = await two_batches_and_a_time_between(adapter, 0)
    done = await open_receiver(0, "app")
    await take_and_ack(done, 10)
    await done.shutdown()
    await adapter.rewind_queues([0], "app", between)
    assert await adapter.lag(0, "app") == 5
    assert numbers(await take_rest(await open_receiver(0, "app"), 5)) == [5, 6, 7, 8, 9]


async def test_rewinding_to_a_time_before_1970_redelivers_every_message(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    # `conveyor rewind --to 1960-01-01T00:00:00Z` on Kafka was a traceback: aiokafka
    # refuses a negative time ("The target time cannot be negative"). Every message is
    # after it: the start of the queue.
    await adapter.enqueue(0, numbered(range(3), stamp=True))
    done = await open_receiver(0, "app")
    await take_and_ack(done, 3)
    await done.shutdown()
    await adapter.rewind_queues([0], "app", -315_619_200.0)
    assert await adapter.lag(0, "app") == 3
    assert numbers(await take_rest(await open_receiver(0, "app"), 3)) == [0, 1, 2]


async def test_a_forward_rewind_is_refused_on_every_queue_before_any_moves(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    between = await two_batches_and_a_time_between(adapter, 0, 1)
    all_done, part_done = await open_receiver(0, "app"), await open_receiver(1, "app")
    await take_and_ack(all_done, 10)
    await take_and_ack(part_done, 4)  # queue 1 stands at message 4, before the moment
    await all_done.shutdown()
    await part_done.shutdown()
    # Back on queue 0, but ahead on queue 1 (message 4 was never handled): nothing moves.
    with pytest.raises(ForwardRewindError, match=r"queue 1: 1 message\(s\) skipped"):
        await adapter.rewind_queues([0, 1], "app", between)
    assert (await adapter.lag(0, "app"), await adapter.lag(1, "app")) == (0, 6)
    await adapter.rewind_queues([0, 1], "app", between, allow_forward=True)
    assert (await adapter.lag(0, "app"), await adapter.lag(1, "app")) == (5, 5)


async def test_a_forward_rewind_to_a_token_names_the_messages_it_would_skip(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    sent = await adapter.enqueue(0, numbered(range(10)))
    receiver = await open_receiver(0, "app")
    await take_and_ack(receiver, 4)
    await receiver.shutdown()
    with pytest.raises(ForwardRewindError, match=r"queue 0: 3 message\(s\) skipped"):
        await adapter.rewind_queues([0], "app", sent[7])  # 4, 5 and 6 never handled
    assert await adapter.lag(0, "app") == 6
    await adapter.rewind_queues([0], "app", sent[7], allow_forward=True)
    assert numbers(await take_rest(await open_receiver(0, "app"), 3)) == [7, 8, 9]


async def test_a_token_past_the_queue_end_loses_none_of_the_messages_published_later(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    """No message lies yet between a finished app's position and such a token: what it
    would skip is every message published until the queue reaches it. Redis keeps a
    position there, so it is refused as forward; Kafka keeps none, so it is refused
    even with ``allow_forward``; the memory broker moves the position to the end,
    which skips nothing. Either way every message published afterwards is delivered,
    once (no receiver stopped mid-way: no duplicate is allowed)."""
    await adapter.enqueue(0, numbered(range(3)))
    done = await open_receiver(0, "app")
    await take_and_ack(done, 3)
    await done.shutdown()
    beyond = SequenceToken(0, 99_999_999_999_999)
    if adapter.name == "memory":
        assert await adapter.rewind_queues([0], "app", beyond) == []
    elif adapter.name == "redis":
        with pytest.raises(ForwardRewindError, match="every message published until the "
                           "stream's ids reach 99999999999999-0"):
            await adapter.rewind_queues([0], "app", beyond)
    else:
        for allow_forward in (False, True):
            with pytest.raises(TokenRangeError, match="past the end of the partition "
                               r"\(its next offset is 3\)"):
                await adapter.rewind_queues([0], "app", beyond, allow_forward=allow_forward)
    await adapter.enqueue(0, numbered(range(3, 8)))
    got = await take_rest(await open_receiver(0, "app"), 5)
    assert numbers(got) == [3, 4, 5, 6, 7]


async def test_a_time_in_the_future_loses_none_of_the_messages_published_later(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    """As a token past the end: a finished app's position would pass every message
    published until then. Redis keeps a position at the time, so it is refused as
    forward; Kafka keeps none past a partition's end and would resolve the time to the
    end as it is now, delivering the messages the time says to skip, so it is refused
    even with ``allow_forward`` (it took it, the same as the current time); the memory
    broker moves the position to the end."""
    await adapter.enqueue(0, numbered(range(3)))
    done = await open_receiver(0, "app")
    await take_and_ack(done, 3)
    await done.shutdown()
    later = time.time() + 3600
    if adapter.name == "memory":
        assert await adapter.rewind_queues([0], "app", later) == []
    elif adapter.name == "redis":
        with pytest.raises(ForwardRewindError, match="every message published until "):
            await adapter.rewind_queues([0], "app", later)
    else:
        for allow_forward in (False, True):
            with pytest.raises(TokenRangeError, match="a time in the future: Kafka keeps no "
                               "position past a partition's end"):
                await adapter.rewind_queues([0], "app", later, allow_forward=allow_forward)
    await adapter.enqueue(0, numbered(range(3, 8)))
    got = await take_rest(await open_receiver(0, "app"), 5)
    assert numbers(got) == [3, 4, 5, 6, 7]


async def test_a_token_of_another_queue_is_refused(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    [other] = await adapter.enqueue(1, numbered([0]))
    with pytest.raises(BrokerError, match=f"token {other} is for queue 1, not 0"):
        await adapter.rewind_queues([0], "app", other)


async def test_rewinding_a_queue_a_receiver_of_the_group_still_owns_is_refused(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    sent = await adapter.enqueue(0, numbered(range(3)))
    owner = await open_receiver(0, "app")
    await take_and_ack(owner, 3)
    with pytest.raises(QueueOwnedError, match=r"app 'app' are still owned \(queue 0 by "):
        await adapter.rewind_queues([0], "app", sent[0])
    assert await adapter.lag(0, "app") == 0  # not moved
    await owner.shutdown()
    await adapter.rewind_queues([0], "app", sent[0])  # once it is gone
    assert await adapter.lag(0, "app") == 3


async def test_rewinding_a_queue_leased_to_a_daemon_is_refused(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    """What the adapter cannot see, the daemons' lease store can (``conveyor rewind``
    passes its owners in)."""
    sent = await adapter.enqueue(0, numbered(range(3)))
    receiver = await open_receiver(0, "app")
    await take_and_ack(receiver, 3)
    await receiver.shutdown()
    with pytest.raises(QueueOwnedError, match="queue 0 by daemon-7"):
        await adapter.rewind_queues([0], "app", sent[0], lease_owners={0: "daemon-7"})
    assert await adapter.lag(0, "app") == 0
    await adapter.rewind_queues([0], "app", sent[0], lease_owners={1: "daemon-7"})
    assert await adapter.lag(0, "app") == 3
