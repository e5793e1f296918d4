"""A ``kafka-group`` daemon is ready once the group has assigned it its partitions, and
says what it waits for until then (``conveyor worker`` prints both)."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.workers.daemon import WorkerDaemon
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config

pytestmark = pytest.mark.kafka


async def test_a_kafka_group_daemon_is_ready_once_it_owns_its_partitions(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": "kafka-group"})
    rec = Recorder()
    rec.app.name = f"kafka-ready-{topic}"  # a group of its own (see test_kafka_http)
    daemon = WorkerDaemon(rec.app, config)
    await daemon.start()
    waiting: list[str] = []
    owned_when_ready: list[list[int]] = []
    ready = asyncio.Event()

    def on_ready() -> None:
        owned_when_ready.append(daemon.balancer.owned())
        ready.set()

    try:
        daemon.when_ready(on_ready, waiting.append)
        # The group's first round takes seconds (3 s on tansu): not ready at the start.
        assert waiting == [f"consumer group {rec.app.name!r} to assign its partitions"]
        assert owned_when_ready == []
        async with asyncio.timeout(20):
            await ready.wait()
        assert owned_when_ready == [[0, 1]]
    finally:
        await daemon.stop()

