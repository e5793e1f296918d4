"""Acknowledging: at least once across owners, only the done prefix, and lag."""

from __future__ import annotations

from conveyor.platform.adapter import QueueAdapter
from tests.contract.conftest import Open
from tests.contract.support import numbered, numbers, take, take_rest, tokens


async def test_messages_taken_but_not_acknowledged_go_to_the_next_receiver_first(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    await adapter.enqueue(0, numbered(range(6)))
    first = await open_receiver(0, "app")
    await take(first, 4)
    await first.shutdown()  # the owner goes with four messages unacknowledged
    second = await open_receiver(0, "app")
    assert numbers(await take_rest(second, 6)) == [0, 1, 2, 3, 4, 5]


async def test_after_acknowledging_a_prefix_the_next_receiver_gets_exactly_the_rest(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    await adapter.enqueue(0, numbered(range(10)))
    first = await open_receiver(0, "app")
    taken = await take(first, 6)
    await first.acknowledge(tokens(taken[:3]))
    await first.shutdown()
    second = await open_receiver(0, "app")
    assert numbers(await take_rest(second, 7)) == [3, 4, 5, 6, 7, 8, 9]


async def test_messages_done_above_an_unfinished_one_are_skipped_only_where_recorded(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    """0 and 1 done and acknowledged, 2 unfinished, 3 and 4 done: as the agent reports it.

    A backend that records messages done out of order (Kafka: one committed watermark)
    skips them for the next owner; the others deliver them again (at least once).
    """
    await adapter.enqueue(0, numbered(range(10)))
    first = await open_receiver(0, "app")
    taken = await take(first, 6)
    await first.acknowledge(tokens(taken[:2]))
    recorded = first.records_done_out_of_order
    if recorded:
        for token in tokens(taken[3:5]):
            first.message_done_out_of_order(token)
        await first.acknowledge([])  # what the agent does when it drains
    await first.shutdown()
    second = await open_receiver(0, "app")
    expected = [2, 5, 6, 7, 8, 9] if recorded else [2, 3, 4, 5, 6, 7, 8, 9]
    assert numbers(await take_rest(second, len(expected))) == expected


async def test_lag_counts_undelivered_and_unacknowledged_messages_per_group(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    await adapter.enqueue(0, numbered(range(5)))
    assert await adapter.lag(0, "app") == 5  # nothing delivered yet
    receiver = await open_receiver(0, "app")
    taken = await take(receiver, 3)
    assert await receiver.lag() == 5 and await adapter.lag(0, "app") == 5  # 3 taken, 2 not
    await receiver.acknowledge(tokens(taken[:2]))
    assert await receiver.lag() == 3 and await adapter.lag(0, "app") == 3
    await receiver.acknowledge(tokens(taken[2:]) + tokens(await take(receiver, 2)))
    assert await receiver.lag() == 0 and await adapter.lag(0, "app") == 0
    assert await adapter.lag(0, "other-app") == 5  # another group's lag is its own
    assert await adapter.lag(1, "app") == 0  # an empty queue
