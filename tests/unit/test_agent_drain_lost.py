"""A queue lost (lease gone) while it drains: the drain ends, it does not raise.

Seen in the Sentinel failover test: a daemon handing queues over (a drain each) lost
their leases meanwhile (renewals unconfirmed by a replica); the abort cancelled the
acknowledgement flush the drain was waiting on, the drain raised ``CancelledError``, and
the balancer's re-balance loop, which had called it, ended with it: the daemon never
took a queue again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from conveyor import App, Client, MessageContext, Publish
from conveyor.adapters.memory import MemoryAdapter, MemoryReceiver, reset_broker
from conveyor.platform.agent import PullingAgent
from conveyor.platform.config import load_config
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.workers.daemon.build import build_parts
from tests.conftest import wait_until


class StalledAcks(MemoryReceiver):
    """Acknowledgements that hang, as ones waiting on ``WAIT`` for a missing replica."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ack_started = asyncio.Event()

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        self.ack_started.set()
        await asyncio.Event().wait()


async def test_a_drain_whose_queue_is_lost_meanwhile_returns() -> None:
    reset_broker("drain-lost")
    adapter = MemoryAdapter("drain-lost")
    app = App("drain-lost")

    handled: list[int] = []

    @app.handler("items")
    async def handle(item: dict[str, int], ctx: MessageContext) -> None:
        handled.append(item["seq"])

    config = load_config(None, environ={}, overrides={
        "memory": {"broker": "drain-lost"}, "queues": {"total": 1}})
    parts = build_parts(app, config, adapter=adapter)
    client = Client(adapter, HashRingQueueMapper(1))
    await client.publish_batch([Publish("items", f"k{i}", {"seq": i}) for i in range(5)])
    receiver = StalledAcks(adapter.broker, 0, app.name)
    await receiver.initialize()
    agent = PullingAgent(0, receiver, parts.subscriptions, parts.orphans, parts.slots,
                         parts.settings)
    agent.start()
    await wait_until(receiver.ack_started.is_set, 5, what="an acknowledgement in flight")

    await wait_until(lambda: sorted(handled) == list(range(5)), 5, what="all 5 handled")
    drain = asyncio.create_task(agent.drain(5.0))
    # The handler calls are over, so the drain goes on to the last acknowledgements and
    # waits there: the one in flight never returns. A few loop turns take it that far.
    await wait_until(lambda: agent._stopping and agent._quiet.is_set(), 5,
                     what="the drain past its handler calls")
    for _ in range(10):
        await asyncio.sleep(0)
    assert not drain.done(), "the drain ended before the abort: nothing was shown"
    await agent.abort()  # the lease is lost meanwhile
    async with asyncio.timeout(5):
        drained = await drain  # before the fix: CancelledError raised here
    assert drained is True  # the handler calls finished in time (False: abandoned ones)
    assert not drain.cancelled() and agent.aborted
    # Nothing lost: each message ran once, and none was acknowledged, so all 5 wait for
    # the queue's next owner (no duplicates here: nothing was redelivered yet).
    assert handled == sorted(handled) == list(range(5))
    assert await adapter.lag(0, app.name) == 5
