"""Several apps on one broker (docs/apps-on-one-broker.md), on every backend:

* apps that share a Redis prefix / Kafka topic share its queues: each is its own consumer
  group, handles its namespaces and skips (acknowledges, counts) the others';
* ``[queues] new_group_start = "latest"``: a new app starts at the queues' end, so it
  neither handles nor skips what was published before it first ran; ``earliest`` (the
  default) starts at their start and misses nothing;
* an app that skips most of what it takes is told so, once, with the fix;
* apps on different prefixes / topics never see each other's messages.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.platform.config import Config, load_config
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until

Backend = Callable[..., Config]


class Item(msgspec.Struct):
    seq: int


@pytest.fixture(params=["memory", "redis", "kafka"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """``make(shared_space, **queues)``: a config of this backend for one isolated test,
    whose queues live in ``shared_space`` (a Redis prefix, a Kafka topic, a memory broker)."""
    kind = request.param
    base: dict[str, dict[str, Any]] = {
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 100, "drain_timeout_s": 5.0},
    }
    if kind == "redis":
        request.applymarker(pytest.mark.redis)
        server = request.getfixturevalue("redis_server")
        base["redis"] = {"url": server.url}
    elif kind == "kafka":
        request.applymarker(pytest.mark.kafka)
        broker = request.getfixturevalue("tansu")
        base["kafka"] = {"bootstrap": broker.bootstrap}
    run = uuid.uuid4().hex[:8]

    def make(space: str, **queues: Any) -> Config:
        overrides = {k: dict(v) for k, v in base.items()}
        overrides["queues"] = {"adapter": kind, "total": 1, **queues}
        name = f"{space}-{run}"
        section, field = {"memory": ("memory", "broker"), "redis": ("redis", "prefix"),
                          "kafka": ("kafka", "topic")}[kind]
        overrides.setdefault(section, {})[field] = name
        return load_config(None, environ={}, overrides=overrides)

    return make


def recording_app(name: str, namespace: str) -> tuple[App, list[int]]:
    app, seen = App(name), []

    @app.handler(namespace)
    async def record(item: Item) -> None:
        seen.append(item.seq)

    return app, seen


async def publish(config: Config, namespace: str, seqs: range) -> None:
    async with Client.from_config(config) as client:
        await client.publish_batch(Publish(namespace, f"k{s % 5}", Item(s)) for s in seqs)


async def test_a_new_app_starting_latest_skips_the_backlog_and_earliest_misses_nothing(
    backend: Backend,
) -> None:
    shared = backend("shared")
    await publish(shared, "a", range(0, 100))  # the backlog: before either app ran
    await publish(shared, "b", range(1000, 1100))
    b_app, b_seen = recording_app("app-b", "b")
    b = WorkerDaemon(b_app, backend("shared", new_group_start="latest"))
    await b.start()
    try:
        # Probe until the queue is positioned (one queue): one probe handled means it is.
        probes: list[int] = []

        async def probed() -> bool:
            if b_seen:
                return True
            probes.append(5000 + len(probes))
            await publish(shared, "b", range(probes[-1], probes[-1] + 1))
            return False

        await wait_until(probed, 30, interval_s=0.2, what="app b positioned at the end")
        handled_probes = len(b_seen)
        await publish(shared, "a", range(100, 130))
        await publish(shared, "b", range(1100, 1130))
        await wait_until(lambda: len(b_seen) == handled_probes + 30 and b.stats.skipped == 30,
                         30, what="b's 30 new messages, and the 30 new 'a' skipped")
    finally:
        report_b = await b.stop()
    a_app, a_seen = recording_app("app-a", "a")
    a = WorkerDaemon(a_app, shared)  # new_group_start = "earliest", the default
    await a.start()
    try:
        b_total = 100 + len(probes) + 30  # every 'b' message ever published
        await wait_until(lambda: len(a_seen) == 130 and a.stats.skipped == b_total, 30,
                         what="app a's backlog and new ones, every 'b' skipped")
    finally:
        report_a = await a.stop()
    # Graceful stops: nothing may be handled twice, nothing of the backlog reached b.
    assert set(b_seen[:handled_probes]) <= set(probes)
    assert sorted(b_seen[handled_probes:]) == list(range(1100, 1130))
    assert report_b.skipped == 30, "only the 'a' messages published after b started"
    assert sorted(a_seen) == list(range(130))
    assert report_a.skipped == b_total


async def test_an_app_skipping_most_of_what_it_takes_is_told_once_with_the_fix(
    backend: Backend, caplog: pytest.LogCaptureFixture,
) -> None:
    shared = backend("busy")
    await publish(shared, "others", range(0, 1000))
    await publish(shared, "mine", range(2000, 2010))
    app, seen = recording_app("newcomer", "mine")
    daemon = WorkerDaemon(app, shared)
    with caplog.at_level(logging.WARNING, logger="conveyor.agent"):
        await daemon.start()
        try:
            await wait_until(lambda: len(seen) == 10 and daemon.stats.skipped == 1000, 30,
                             what="everything taken")
        finally:
            await daemon.stop()
    told = [r.getMessage() for r in caplog.records if "it is reading other apps'" in r.message]
    assert len(told) == 1, told
    assert "app 'newcomer' skipped" in told[0] and "(others)" in told[0]
    assert "[redis] prefix or [kafka] topic" in told[0]


async def test_apps_on_their_own_prefix_or_topic_never_see_each_others_messages(
    backend: Backend, caplog: pytest.LogCaptureFixture,
) -> None:
    shop, billing = backend("shop"), backend("billing")
    await publish(shop, "orders", range(0, 200))
    await publish(billing, "invoices", range(500, 550))
    shop_app, orders = recording_app("shop", "orders")
    billing_app, invoices = recording_app("billing", "invoices")
    daemons = [WorkerDaemon(shop_app, shop), WorkerDaemon(billing_app, billing)]
    for d in daemons:
        await d.start()
    try:
        await wait_until(lambda: len(orders) == 200 and len(invoices) == 50, 30,
                         what="both apps' messages")
    finally:
        reports = [await d.stop() for d in daemons]
    assert sorted(orders) == list(range(200)) and sorted(invoices) == list(range(500, 550))
    assert [r.skipped for r in reports] == [0, 0]


@pytest.mark.kafka
async def test_a_latest_start_on_kafka_is_committed_before_anything_is_handled(
    tansu: Any,
) -> None:
    """Kafka keeps no position for a group until it commits: the start is committed at
    once, so a daemon stopped before its first acknowledgement restarts where it began,
    not at a later end (which would skip what was published meanwhile)."""
    from conveyor.backends import create_adapter

    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": 1, "new_group_start": "latest"},
        "kafka": {"bootstrap": tansu.bootstrap, "topic": f"latest-{uuid.uuid4().hex[:8]}"},
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 100, "drain_timeout_s": 5.0},
    })
    await publish(config, "b", range(0, 10))  # before the app: not for it
    app, seen = recording_app("late-joiner", "b")
    adapter = create_adapter("kafka", config)
    try:
        daemon = WorkerDaemon(app, config)
        await daemon.start()
        try:
            async def committed() -> bool:
                return await adapter.groups.has([0], "late-joiner")

            await wait_until(committed, 30, interval_s=0.2, what="the start committed")
        finally:
            await daemon.stop()
    finally:
        await adapter.close()
    assert seen == []
    await publish(config, "b", range(10, 30))  # while no daemon of the app runs
    daemon = WorkerDaemon(app, config)
    await daemon.start()
    try:
        await wait_until(lambda: len(seen) == 20, 30, what="what was published while down")
    finally:
        await daemon.stop()
    assert sorted(seen) == list(range(10, 30))
