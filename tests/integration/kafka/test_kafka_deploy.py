"""The rendered ScaledObject's kafka trigger names the group and topic a real daemon uses.

KEDA's kafka scaler reads the ``consumerGroup``'s committed offsets on ``topic`` and
subtracts them from the partitions' ends. A ``kafka-group`` daemon of the app runs on
the tansu broker; the test checks that the daemon is a member of that group and that its
committed offsets on that topic advance to exactly what was handled.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from conveyor import Client, Publish
from conveyor.deploy import kubernetes as k8s
from conveyor.platform.config import load_config
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder

pytestmark = [pytest.mark.kafka]


async def test_the_kafka_trigger_names_the_daemons_group_and_topic(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        f'[queues]\nadapter = "kafka"\ntotal = 2\n'
        f'[kafka]\nbootstrap = "{tansu.bootstrap}"\ntopic = "{topic}"\n'
        f"session_timeout_ms = 6000\nheartbeat_interval_ms = 500\n"
        f'[balancer]\nkind = "kafka-group"\n[worker]\npoll_timeout_ms = 200\n'
        f"drain_timeout_s = 5.0\n"
    )
    config = load_config(file, environ={})  # as `conveyor deploy kubernetes` reads it
    rec = Recorder()
    rec.app.name = f"k8s-{uuid.uuid4().hex[:8]}"  # the broker is shared by the session
    gate = asyncio.Event()
    for key in (f"k{i}" for i in range(6)):
        rec.hold[key] = gate
    objects = k8s.render(config, k8s.Options(
        app_path="shop:app", app_name=rec.app.name, config_text=file.read_text(), image="x"))
    [scaled] = [o for o in objects if o["kind"] == "ScaledObject"]
    [trigger] = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["bootstrapServers"] == tansu.bootstrap
    assert scaled["spec"]["maxReplicaCount"] == 2
    items = [Publish("orders", f"k{i % 6}", {"k": f"k{i % 6}", "seq": i // 6})
             for i in range(30)]
    admin = AIOKafkaAdminClient(bootstrap_servers=meta["bootstrapServers"])
    await admin.start()
    daemon = WorkerDaemon(rec.app, config)
    await daemon.start()
    try:
        async with Client.from_config(config) as client:
            await client.publish_batch(items)

        async def daemon_in_group() -> bool:
            # (tansu answers ListGroups with nothing; DescribeGroups names the members.)
            [described] = await admin.describe_consumer_groups([meta["consumerGroup"]])
            [(error, group, *_, members)] = described.groups
            return error == 0 and group == meta["consumerGroup"] and any(
                m[0].startswith(daemon.member.id) for m in members)

        await wait_until(daemon_in_group, 30, 0.1, "the daemon to join the trigger's group")

        async def committed() -> int:
            offsets = await admin.list_consumer_group_offsets(
                meta["consumerGroup"],
                partitions=[TopicPartition(meta["topic"], q) for q in range(2)])
            return sum(o.offset for o in offsets.values() if o.offset >= 0)

        # Handlers wait: nothing committed, so KEDA's lag is the whole backlog.
        assert await committed() == 0
        gate.set()
        await wait_until(lambda: len(rec.seen) == len(items), 30, 0.05, "all handled")

        async def all_committed() -> bool:
            return await committed() == len(items)

        # One offset per record: the committed offsets on the trigger's topic, for the
        # trigger's group, reach what was published (KEDA's lag then reads 0).
        await wait_until(all_committed, 30, 0.1, "the group's commits on the topic")
    finally:
        gate.set()
        await daemon.stop()
        await admin.close()
    # No fault here: every message exactly once.
    assert sorted(rec.seen) == sorted((p.key, p.body["seq"]) for p in items)
