"""/readyz on kafka-group: not joined until the coordinator has answered with an
assignment, ready after; /metrics counts what the daemon handled."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.client import Client, Publish
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import free_port, wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config

pytestmark = pytest.mark.kafka


async def test_a_kafka_group_daemon_is_ready_once_assigned_and_counts_what_it_handled(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": "kafka-group"}, http={"port": 9})
    n = 30
    async with Client.from_config(config) as client:
        await client.publish_batch(
            [Publish("orders", f"k{i % 6}", {"k": f"k{i % 6}", "seq": i}) for i in range(n)]
        )
    rec = Recorder()
    # A group of its own: the session's tansu keeps the state of groups other tests left
    # (and once stopped assigning a reused group's partitions, see docs/kafka.md).
    rec.app.name = f"kafka-http-{topic}"
    daemon = WorkerDaemon(rec.app, config)
    assert daemon.readiness() == "starting"
    await daemon.start()
    await wait_until(lambda: daemon.readiness() is None, 20, what="ready (assigned)")
    assert daemon.balancer.joined()
    await wait_until(lambda: len(rec.seen) == n, 20, what=f"{n} handled")
    text = daemon.telemetry.prometheus_text().decode()
    report = await daemon.stop()
    handled = [s.value for f in text_string_to_metric_families(text)
               if f.name == "conveyor_messages_handled" for s in f.samples]
    assert handled == [n]
    # Exactly what was published, once each: one daemon, nothing re-balanced.
    assert sorted(seq for _, seq in rec.seen) == list(range(n))
    assert report.handled == n and report.abandoned == 0


async def test_a_kafka_group_daemon_whose_broker_is_down_is_started_but_not_joined() -> None:
    config = kafka_config(f"127.0.0.1:{free_port()}", "nobody-listens",
                          balancer={"kind": "kafka-group"})
    daemon = WorkerDaemon(Recorder().app, config)
    await daemon.start()  # gives up waiting after ~5 s; the join goes on in the background
    try:
        assert daemon.started
        assert daemon.readiness() == "not joined yet (membership or consumer group unreachable?)"
    finally:
        await daemon.stop()
    assert daemon.readiness() == "draining"
