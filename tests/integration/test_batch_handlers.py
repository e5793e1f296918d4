"""Batch handlers on the embedded adapter: order per stream, acks, dead letters, drain."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

import msgspec

from conveyor import App, Client
from conveyor.platform.message import Message
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter


class Click(msgspec.Struct):
    stream: str
    seq: int
    poison: bool = False


class Seen:
    """What a batch handler saw: each call's batch, every click's handling count."""

    def __init__(self) -> None:
        self.batches: list[list[Click]] = []
        self.handled: Counter[tuple[str, int]] = Counter()
        self.order: dict[str, list[int]] = defaultdict(list)
        self.running = 0
        self.max_running = 0

    def ok(self, batch: list[Click]) -> None:
        for c in batch:
            self.handled[c.stream, c.seq] += 1
            self.order[c.stream].append(c.seq)


def clicks(n: int, streams: int, poison: frozenset[int] = frozenset()) -> list[Click]:
    return [Click(f"s{i % streams}", i, i in poison) for i in range(n)]


async def publish(client: Client, items: list[Click]) -> list[Message]:
    msgs = [client.build("clicks", c.stream, c) for c in items]
    for m in msgs:
        await client.adapter.enqueue(client.mapper.queue_for(m.stream), [m])
    return msgs


def batch_app(seen: Seen, *, size: int, wait_ms: float = 20, delay_s: float = 0.0,
              attempts: int = 1) -> App:
    app = App("test")

    @app.handler("clicks", batch_size=size, batch_wait_ms=wait_ms, retry_attempts=attempts,
                 retry_delay_s=0.001)
    async def on_clicks(batch: list[Click]) -> None:
        seen.batches.append(batch)
        if any(c.poison for c in batch):
            raise ValueError(f"poison in {[c.seq for c in batch if c.poison]}")
        seen.running += 1
        seen.max_running = max(seen.max_running, seen.running)
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
        finally:
            seen.running -= 1
        seen.ok(batch)

    return app


async def test_batches_keep_each_streams_order_and_every_message_is_handled_once() -> None:
    adapter = fresh_adapter()
    seen = Seen()
    d = daemon(batch_app(seen, size=50, delay_s=0.002), adapter, config(slots={"count": 4}))
    items = clicks(3000, streams=40)
    await publish(Client(adapter, d.mapper), items)
    await d.start()
    await wait_until(lambda: len(seen.handled) == 3000, 30, what="all handled")
    report = await d.stop()
    # Exactly once each: no failure, no crash, so no duplicate is allowed.
    assert seen.handled == Counter({(c.stream, c.seq): 1 for c in items})
    for stream, seqs in seen.order.items():
        assert seqs == sorted(seqs), f"stream {stream} out of order"
    for batch in seen.batches:  # a stream's messages in a batch: consecutive, in order
        assert len(batch) <= 50
        runs = [c.stream for i, c in enumerate(batch) if i == 0 or batch[i - 1].stream != c.stream]
        assert len(runs) == len(set(runs)), "a stream split into two runs within a batch"
    assert sum(map(len, seen.batches)) == 3000
    assert len(seen.batches) < 3000 / 10, "messages should have been batched"
    assert report.acked == 3000 and report.dead_lettered == 0
    assert sum([await adapter.lag(q, "test") for q in range(8)]) == 0
