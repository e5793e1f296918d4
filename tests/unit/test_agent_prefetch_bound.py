"""``cache_capacity`` bounds what a queue's agent has pulled and not acknowledged —
what a crash or a lost lease may run again — not only what its cache holds: messages
done and taken out of the cache still count until the broker confirms their
acknowledgement.

Seen in the Redis outage test: the cache of 32 per queue was full when Redis went down,
and the acknowledgement of messages just taken out of it never arrived, so 8 queues
returned 257 messages to run again, one more than 8 x 32.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from conveyor import App, Client, Publish
from conveyor.adapters.memory import MemoryAdapter, MemoryReceiver, reset_broker
from conveyor.platform.agent import PullingAgent
from conveyor.platform.config import load_config
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message
from conveyor.workers.daemon.build import build_parts
from tests.conftest import wait_until

CAPACITY, MAX_BATCH, N, STREAMS = 8, 4, 40, 5


class GatedAcks(MemoryReceiver):
    """Acknowledgements that wait for the test's gate (a broker slow to confirm, or
    gone); counts what was pulled and what was confirmed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gate = asyncio.Event()
        self.pulled = self.confirmed = self.worst = 0

    async def get_messages(self, max_messages: int, timeout_s: float) -> list[Message]:
        got = await super().get_messages(max_messages, timeout_s)
        self.pulled += len(got)
        self.worst = max(self.worst, self.pulled - self.confirmed)
        return got

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        await self.gate.wait()
        await super().acknowledge(tokens)
        self.confirmed += len(tokens)


async def test_messages_awaiting_their_acknowledgement_count_against_the_capacity() -> None:
    reset_broker("prefetch-bound")
    adapter = MemoryAdapter("prefetch-bound")
    app = App("prefetch-bound")
    handled: list[tuple[str, int]] = []

    @app.handler("items")
    async def handle(item: dict[str, int]) -> None:
        handled.append((f"k{item['seq'] % STREAMS}", item["seq"]))

    config = load_config(None, environ={}, overrides={
        "memory": {"broker": "prefetch-bound"}, "queues": {"total": 1},
        "worker": {"cache_capacity": CAPACITY, "max_batch": MAX_BATCH}})
    parts = build_parts(app, config, adapter=adapter)
    published = [Publish("items", f"k{i % STREAMS}", {"seq": i}) for i in range(N)]
    await Client(adapter, HashRingQueueMapper(1)).publish_batch(published)
    receiver = GatedAcks(adapter.broker, 0, app.name)
    await receiver.initialize()
    agent = PullingAgent(0, receiver, parts.subscriptions, parts.orphans, parts.slots,
                         parts.settings)
    agent.start()
    try:
        # With no acknowledgement confirmed, the agent runs what it holds and then waits
        # for room: it pulls no more (before the fix it pulled on as the cache emptied).
        await wait_until(lambda: agent._acks.wants_room and len(handled) == CAPACITY, 5,
                         what="the capacity's messages handled, the pull loop waiting")
        assert receiver.pulled == CAPACITY
        receiver.gate.set()
        await wait_until(lambda: receiver.confirmed == N, 5, what="every message acknowledged")
    finally:
        await agent.drain(5.0)
    assert receiver.worst <= CAPACITY
    # Nothing lost or doubled, each stream in order (no fault here: no duplicates).
    assert sorted(seq for _, seq in handled) == list(range(N))
    for s in range(STREAMS):
        seqs = [seq for key, seq in handled if key == f"k{s}"]
        assert seqs == sorted(seqs)
    assert await adapter.lag(0, app.name) == 0
