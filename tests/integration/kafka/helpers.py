"""Config and app builders shared by the Kafka tests."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from conveyor import WorkerDaemon
from conveyor.platform.app import App
from conveyor.platform.balancing.balancer import Lease
from conveyor.platform.config import Config, load_config
from tests.proxy import CuttableProxy as CuttableProxy  # re-exported for the Kafka tests


def kafka_config(bootstrap: str, topic: str, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "queues": {"adapter": "kafka", "total": 1},
        "kafka": {"bootstrap": bootstrap, "topic": topic, "session_timeout_ms": 6000,
                  "heartbeat_interval_ms": 500},
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 200, "drain_timeout_s": 5.0},
    }
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, environ={}, overrides=overrides)


async def nothing_left_unacknowledged(daemon: WorkerDaemon) -> bool:
    """Whether the daemon's app has acknowledged everything on every queue: then no
    message can be delivered again, so a test waits for this instead of sleeping a
    while for a late redelivery to show up."""
    queues = range(daemon.config.queues.total)
    return all([await daemon.adapter.lag(q, daemon.app.name) == 0 for q in queues])


class Recorder:
    """An app whose handler records (key, seq) per namespace, optionally sleeping."""

    def __init__(
        self, namespace: str = "orders", max_delay_s: float = 0.0, min_delay_s: float = 0.0
    ) -> None:
        self.app = App("kafka-test")
        self.seen: list[tuple[str, int]] = []
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.max_delay_s = max_delay_s
        self.min_delay_s = min_delay_s
        self.hold: dict[str, asyncio.Event] = {}
        self.running = 0
        self.peak = 0
        self.first_call_at: float | None = None
        """perf_counter() when the first handler call began; last_done_at: the last ended."""
        self.last_done_at = 0.0

        @self.app.handler(namespace)
        async def handle(body: dict[str, Any]) -> None:
            key, seq = str(body["k"]), int(body["seq"])
            if self.first_call_at is None:
                self.first_call_at = time.perf_counter()
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                gate = self.hold.get(key)
                if gate is not None:
                    await gate.wait()
                if self.max_delay_s:
                    await asyncio.sleep(random.uniform(self.min_delay_s, self.max_delay_s))
            finally:
                self.running -= 1
            self.seen.append((key, seq))
            self.by_key[key].append(seq)
            self.last_done_at = time.perf_counter()


async def read_all(bootstrap: str, topic: str, expected_at_least: int, partitions: int
                   ) -> list[Any]:
    """Every record of ``topic``'s ``partitions``, at least ``expected_at_least`` of them,
    read up to each partition's high watermark."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, q) for q in range(partitions)]
        consumer.assign(tps)
        records: list[Any] = []

        async def behind() -> bool:  # the fetch high watermark (tansu's ListOffsets is off)
            for tp in tps:
                high = consumer.highwater(tp)
                if high is None or await consumer.position(tp) < high:
                    return True
            return False

        while len(records) < expected_at_least or await behind():
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records += batch
        return records
    finally:
        await consumer.stop()


class HeldAcquisitions:
    """A listener whose acquisitions wait for :attr:`go`; it records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.acquiring = asyncio.Event()
        self.go = asyncio.Event()

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.calls.append(("acquiring", queue))
        self.acquiring.set()
        await self.go.wait()
        self.calls.append(("acquired", queue))

    async def queue_released(self, queue: int) -> None:
        self.calls.append(("released", queue))

    async def queue_lost(self, queue: int) -> None:
        self.calls.append(("lost", queue))

    def balancer_failed(self, error: BaseException) -> None:
        self.calls.append(("failed", -1))
