"""Static membership (``[kafka] group_instance_id``) on the test broker: the daemon joins
under its instance id and does not leave the group when it stops.

tansu 0.6.0 does not honour static membership (a group of static members re-balances
every ~6.5 s; docs/kafka.md, "Failover"), so what a restart within the session timeout
buys on Kafka cannot be shown here; this covers what reaches the broker.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from conveyor.adapters.kafka.group_balancer import KafkaGroupBalancer
from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config

pytestmark = pytest.mark.kafka


async def test_a_static_member_joins_under_its_instance_id_and_does_not_leave_on_stop(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    instance = f"pod-{topic}"
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": "kafka-group"},
                          kafka={"group_instance_id": instance})
    # A group of its own: the member stays in it after the test, until its session ends.
    app = App(f"static-{topic}")
    seen: list[tuple[str, int]] = []

    @app.handler("orders")
    async def handle(body: dict[str, Any]) -> None:
        seen.append((body["k"], body["seq"]))

    daemon = WorkerDaemon(app, config)
    await daemon.start()
    try:
        assert isinstance(daemon.balancer, KafkaGroupBalancer)
        assert await daemon.balancer.wait_assigned(20)
        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            described = await admin.describe_consumer_groups([app.name])
        finally:
            await admin.close()
        [member] = described[0].groups[0][5]
        # tansu names a static member after its instance id (a dynamic one after its
        # client id, the daemon's id): the id reached the broker.
        assert member[0].startswith(f"{instance}-"), member
        items = [Publish("orders", f"k{i}", {"k": f"k{i}", "seq": 0}) for i in range(20)]
        async with Client.from_config(config) as client:
            await client.publish_batch(items)
        await wait_until(lambda: len(seen) >= len(items), 30, 0.05, "handled")
    finally:
        await daemon.stop()
    # Nothing failed or moved: each message exactly once.
    assert sorted(seen) == sorted((p.key, 0) for p in items)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("LeaveGroup" in m or "left the group" in m for m in messages), messages
