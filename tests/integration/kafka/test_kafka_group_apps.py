"""kafka-group, what an operator cannot see otherwise (real tansu):

* two different apps run under one name on one topic join one consumer group and split
  its partitions, each skipping the other's messages: every daemon says so once, naming
  both (conveyor/adapters/kafka/app_check.py);
* partitions the coordinator assigns past ``$.queues.total`` are read by no one: the
  daemon says which and what to set, and their records wait for a member that reads
  them.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from conveyor import WorkerDaemon
from conveyor.adapters.kafka.adapter import KafkaAdapter
from conveyor.adapters.kafka.group_balancer import KafkaGroupBalancer
from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.platform.balancing.membership import MemberInfo
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import HeldAcquisitions, kafka_config

pytestmark = pytest.mark.kafka


def shop(*namespaces: str) -> App:
    """An app named ``shop`` handling ``namespaces`` (one handler each)."""
    app = App("shop")
    for ns in namespaces:
        async def handle(body: dict[str, Any]) -> None:
            pass
        app.handler(ns, name=f"on_{ns}")(handle)
    return app


def other_app_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "two different apps" in r.getMessage()]


async def test_two_apps_under_one_name_are_each_told_once_naming_both(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Two daemons of one app (``orders``) and one of another app also named ``shop``
    (``payments``): the coordinator splits the partitions among all three. Each orders
    daemon warns once of the payments one; the payments daemon warns once of the orders
    app (its two daemons have one shape); the two orders daemons say nothing of each
    other."""
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 4},
                          balancer={"kind": "kafka-group"})
    daemons = [WorkerDaemon(shop("orders"), config), WorkerDaemon(shop("orders"), config),
               WorkerDaemon(shop("payments"), config)]
    caplog.set_level(logging.WARNING, logger="conveyor.kafka_group")
    try:
        for daemon in daemons:
            await daemon.start()
        await wait_until(lambda: len(other_app_warnings(caplog)) >= 3, 60, 0.05,
                         "each daemon's warning")
        await wait_until(lambda: sum(len(d.balancer.owned()) for d in daemons) == 4, 30,
                         0.05, "the partitions split among the three")
    finally:
        for daemon in daemons:
            await daemon.stop()
    said = other_app_warnings(caplog)
    assert len(said) == 3, said
    orders, payments = "['on_orders'] (namespaces ['orders'])", \
        "['on_payments'] (namespaces ['payments'])"
    about_payments = [s for s in said if s.index(payments) < s.index(orders)]
    about_orders = [s for s in said if s.index(orders) < s.index(payments)]
    assert len(about_payments) == 2 and len(about_orders) == 1, said
    for line in said:
        assert line.startswith("group 'shop' (the app's name) also has member shop-")
        assert "Give each app its own name (App(name=...))" in line


async def test_partitions_past_the_total_are_named_once_and_their_records_wait(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A daemon with ``queues.total = 2`` in a group on a 4-partition topic (the topic
    gained partitions under it: tansu has no CreatePartitions, and a start refuses such
    a topic, so its topic check is skipped here). Alone, it is assigned all four: it
    reads 0 and 1, warns once of 2 and 3 naming the setting, and no one reads them —
    then a daemon whose total covers them handles the record waiting on partition 3."""
    four = kafka_config(tansu.bootstrap, topic, queues={"total": 4},
                        balancer={"kind": "kafka-group"})
    async with Client.from_config(four) as client:  # creates the topic: 4 partitions
        await client.publish_batch([Publish("jobs", f"k{i}", {"i": i}) for i in range(12)])
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": "kafka-group"})
    adapter = KafkaAdapter(config.kafka, 2)

    async def already_checked() -> None:
        pass

    adapter.cluster.ensure_topic = already_checked  # type: ignore[method-assign]
    balancer = KafkaGroupBalancer(adapter, "shop", 2)
    listener = HeldAcquisitions()
    listener.go.set()  # nothing held here: it records
    caplog.set_level(logging.WARNING, logger="conveyor.kafka_group")
    try:
        await balancer.start(MemberInfo("m", "h", 1, 0.0), listener)
        assert await balancer.wait_assigned(30)
        assert balancer.owned() == [0, 1]
    finally:
        await balancer.stop()
        await adapter.close()
    assert sorted({q for _, q in listener.calls}) == [0, 1], listener.calls
    said = [r.getMessage() for r in caplog.records if "past $.queues.total" in r.getMessage()]
    assert said == [
        f"group shop was assigned partitions [2, 3] of topic {topic!r}, past "
        "$.queues.total = 2: this daemon does not read them and no other member gets "
        "them while it holds them, so their messages wait unhandled (until the topic's "
        "retention deletes them); set $.queues.total to the topic's partition count (at "
        "least 4) and restart the workers"], said

    seen: list[int] = []
    app = App("shop")

    @app.handler("jobs")
    async def handle(body: dict[str, Any]) -> None:
        seen.append(body["i"])

    daemon = WorkerDaemon(app, four)
    try:
        await daemon.start()
        await wait_until(lambda: len(seen) >= 12, 60, 0.05, "every record handled")
    finally:
        await daemon.stop()
    assert sorted(seen) == list(range(12))
