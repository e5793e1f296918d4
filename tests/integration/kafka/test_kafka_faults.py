"""Broker faults: a daemon started before its broker backs off and resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.platform.client import Client, Publish
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import free_port, wait_until
from tests.integration.kafka.conftest import Tansu, tansu_binary
from tests.integration.kafka.helpers import Recorder, kafka_config

pytestmark = pytest.mark.kafka


async def test_a_daemon_whose_broker_is_unreachable_resumes_when_it_comes_up(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    binary = tansu_binary()
    assert binary is not None  # the session fixture already checked
    broker = Tansu(binary, free_port(), tmp_path / "late-tansu.log")
    config = kafka_config(broker.bootstrap, topic)
    rec = Recorder()
    daemon = WorkerDaemon(rec.app, config)
    await daemon.start()  # nothing listens yet: the receiver retries on each pull
    try:
        broker.start()
        async with Client.from_config(config) as client:
            await client.publish_batch([Publish("orders", "a", {"k": "a", "seq": i})
                                        for i in range(20)])
        await wait_until(lambda: len(rec.seen) == 20, 60, 0.05, "handled after the outage")
    finally:
        await daemon.stop()
        broker.stop()
    assert rec.by_key["a"] == list(range(20))
