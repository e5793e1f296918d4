"""Single publishes gathered per queue (conveyor.platform.coalescer), on the memory
adapter: what each call gets back, in which order messages land, and what a failure,
a cancellation and close() do."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.client import Client
from conveyor.platform.errors import BrokerConnectionError, ShutdownError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message

QUEUES = 4


class CountingAdapter(MemoryAdapter):
    """The memory adapter, counting sends; ``fail_next`` sends raise (a broker outage)."""

    def __init__(self, name: str) -> None:
        reset_broker(name)
        super().__init__(name)
        self.sends: list[int] = []
        self.fail_next = 0

    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        await asyncio.sleep(0)  # a send takes at least a loop turn, as on a network
        self.sends.append(len(messages))
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerConnectionError("broker unreachable (injected)")
        return await super().enqueue(queue, messages)


def stored(adapter: MemoryAdapter) -> list[tuple[str, int]]:
    """(stream key, body) of every stored message, in queue order, queue by queue."""
    out = []
    for q in range(QUEUES):
        for msg in adapter.broker.log(q).items:
            out.append((msg.stream.key, int(msg.body)))
    return out


@pytest.fixture
def adapter() -> CountingAdapter:
    return CountingAdapter("coalescer")


def client_of(adapter: MemoryAdapter) -> Client:
    return Client(adapter, HashRingQueueMapper(QUEUES), coalesce_linger_s=0.0)


async def test_concurrent_calls_share_sends_and_land_in_call_order(
    adapter: CountingAdapter,
) -> None:
    client = client_of(adapter)

    async def stream(key: str) -> list[SequenceToken]:
        return [await client.publish("n", key, str(i).encode()) for i in range(50)]

    tokens = await asyncio.gather(*(stream(f"k{j}") for j in range(40)))
    await client.close()
    assert sum(adapter.sends) == 2_000
    assert len(adapter.sends) <= 2_000 / 5  # ~10 publishers per queue share each send
    rows = stored(adapter)
    assert len(rows) == 2_000
    for j in range(40):
        assert [i for k, i in rows if k == f"k{j}"] == list(range(50))
    flat = [t for per in tokens for t in per]
    assert len(set(flat)) == 2_000  # each call got its own message's token


async def test_close_sends_what_is_waiting(adapter: CountingAdapter) -> None:
    client = client_of(adapter)
    calls = [asyncio.ensure_future(client.publish("n", "k", str(i).encode()))
             for i in range(100)]
    await asyncio.sleep(0)  # the calls are queued, not yet sent
    await client.close()
    assert all(c.done() and not c.exception() for c in calls)
    assert [i for _, i in stored(adapter)] == list(range(100))
    with pytest.raises(ShutdownError):
        await client.publish("n", "k", b"1")


async def test_a_failed_send_fails_its_calls_and_those_queued_behind(
    adapter: CountingAdapter,
) -> None:
    client = client_of(adapter)
    adapter.fail_next = 1
    first = [asyncio.ensure_future(client.publish("n", "k", str(i).encode()))
             for i in range(10)]
    await asyncio.sleep(0)  # the first send is on its way
    behind = [asyncio.ensure_future(client.publish("n", "k", str(i).encode()))
              for i in range(10, 20)]
    results = await asyncio.gather(*first, *behind, return_exceptions=True)
    assert all(isinstance(r, BrokerConnectionError) for r in results), results
    assert stored(adapter) == []  # nothing of the failed queue was sent after the failure
    assert isinstance(await client.publish("n", "k", b"20"), SequenceToken)  # afresh
    await client.close()
    assert stored(adapter) == [("k", 20)]


async def test_a_call_cancelled_before_its_send_is_not_sent(adapter: CountingAdapter) -> None:
    client = client_of(adapter)
    keep = asyncio.ensure_future(client.publish("n", "k", b"1"))
    drop = asyncio.ensure_future(client.publish("n", "k", b"2"))
    await asyncio.sleep(0)  # both calls are queued; the queue's send has not started
    assert adapter.sends == []
    drop.cancel()
    await keep
    with pytest.raises(asyncio.CancelledError):
        await drop
    await client.close()
    assert stored(adapter) == [("k", 1)]
