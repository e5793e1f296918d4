"""The console's JSON on tansu under both balancers: the app found by its group, its
queues and lag, and its running daemon with what its heartbeat carries (version, ready) —
from the daemon's reports on ``kafka-group``, from the membership store on ``dynamic``;
and its polls: connections kept from one poll to the next, a poll during an outage
bounded, the next one after it recovered."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import conveyor
from conveyor.client import Publish
from conveyor.console.poller import Poller
from conveyor.console.server import Settings, broker_name, create_app
from conveyor.platform.config import Config
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import free_port, process_stopped, wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config, nothing_left_unacknowledged
from tests.proxy import CuttableProxy
from tests.servers import RedisServer
from tests.servers.tansu import require_tansu

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["kafka-group", pytest.param("dynamic", marks=pytest.mark.redis)])
def balancer(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "kafka-group":
        return {"balancer": {"kind": "kafka-group"}}
    redis: RedisServer = request.getfixturevalue("redis_server")
    return {"balancer": {"kind": "dynamic", "membership": "redis"}, "redis": {"url": redis.url}}


async def test_the_console_shows_a_kafka_app_and_its_daemon_under_either_balancer(
    tansu: Tansu, topic: str, balancer: dict[str, Any]
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2}, **balancer)
    rec = Recorder()
    rec.app.name = f"console-{topic}"  # a group of its own on the shared broker
    daemon = WorkerDaemon(rec.app, config)
    await daemon.client.publish_batch([Publish("orders", f"k{n}", {"k": f"k{n}", "seq": n})
                                       for n in range(10)])
    await daemon.start()
    settings = Settings(config, rec.app.name, None, "127.0.0.1", broker_name(config))
    # The console runs on the client's own loop, in its thread: this loop runs the daemon.
    api = TestClient(create_app(settings, Poller(config, rec.app.name, interval_s=0.2)),
                     base_url="http://127.0.0.1:8089")
    await asyncio.to_thread(api.__enter__)
    try:
        await wait_until(lambda: len(rec.seen) == 10, 30, what="10 handled")
        await wait_until(lambda: nothing_left_unacknowledged(daemon), 30, what="all acked")

        async def overview() -> dict[str, Any]:
            found: dict[str, Any] = (await asyncio.to_thread(api.get, "/api/overview")).json()
            return found

        async def daemon_seen_ready() -> bool:
            status = (await overview())["status"].get(rec.app.name)
            return (status is not None and len(status["members"]) == 1
                    and status["members"][0]["stats"].get("ready") == 1
                    and status["members"][0]["stats"].get("handled") == 10
                    and status["total_lag"] == 0)

        await wait_until(daemon_seen_ready, 30, interval_s=0.2,
                         what="the daemon, ready, its 10 handled and no lag in the console's poll")
        data = await overview()
        assert data["error"] is None
        assert data["broker"] == f"kafka {tansu.bootstrap} (topic {topic})"
        assert [a["app"] for a in data["apps"]] == [rec.app.name]
        status = data["status"][rec.app.name]
        assert [q["queue"] for q in status["queues"]] == [0, 1]
        (member,) = status["members"]
        assert member["id"] == daemon.member.id
        assert member["version"] == conveyor.__version__
        assert member["stats"]["loop.stalls"] == 0
        assert sorted(member["queues"]) == [0, 1]
    finally:
        await asyncio.to_thread(api.__exit__, None, None, None)
        await daemon.stop()


@pytest.fixture
async def proxied_app(tmp_path: Path, topic: str) -> AsyncIterator[tuple[Tansu, CuttableProxy,
                                                                         Config]]:
    """A tansu of the test's own behind a proxy every client connection goes through (the
    proxy counts them), with app ``shop``'s group on its 2 queues: 4 messages handled, 1
    dead-lettered, its daemon stopped."""
    broker = Tansu(require_tansu(), free_port(), tmp_path / "tansu.log")
    proxy = CuttableProxy(free_port(), broker.port)
    broker.advertised_port = proxy.port
    await proxy.start()
    broker.start()
    try:
        config = kafka_config(broker.bootstrap, topic, queues={"total": 2},
                              balancer={"kind": "kafka-group"})
        app, handled = conveyor.App("shop"), []

        @app.handler("orders", retry_attempts=1)
        async def handle(body: dict[str, Any]) -> None:
            if body["n"] == 0:
                raise ValueError("order 0 is bad")
            handled.append(body["n"])

        daemon = WorkerDaemon(app, config)
        await daemon.client.publish_batch([Publish("orders", f"o{n}", {"n": n})
                                           for n in range(5)])
        await daemon.start()
        try:
            await wait_until(lambda: len(handled) == 4, 30, what="4 handled")
            await wait_until(lambda: nothing_left_unacknowledged(daemon), 30,
                             what="all acked, the bad one dead-lettered")
        finally:
            await daemon.stop()
        yield broker, proxy, config
    finally:
        broker.stop()
        await proxy.cut()


def _shows_the_app(poller: Poller) -> None:
    reading = poller.reading
    assert reading.error is None, reading.error
    assert reading.apps is not None
    assert [(a.app, a.lag, a.dead_letters) for a in reading.apps.apps] == [("shop", 0, 1)]
    assert reading.status["shop"].dead_letters == 1
    assert [q.lag for q in reading.status["shop"].queues] == [0, 0]


async def test_polls_keep_their_broker_connections_open_across_polls(
    proxied_app: tuple[Tansu, CuttableProxy, Config],
) -> None:
    """A poll that opened an admin client and consumers for each app and closed them again
    made some twenty connections to the broker every poll; kept, a poll makes none."""
    _, proxy, config = proxied_app
    poller = Poller(config, None)
    try:
        await poller.poll()  # the first poll connects
        _shows_the_app(poller)
        before = proxy.accepted
        for _ in range(5):
            await poller.poll()
            _shows_the_app(poller)
        assert proxy.accepted == before, f"{proxy.accepted - before} connections in 5 polls"
    finally:
        await poller.stop()


@pytest.mark.parametrize("outage", ["cut", "frozen"])
async def test_a_poll_during_an_outage_ends_within_its_bound_and_the_next_recovers(
    proxied_app: tuple[Tansu, CuttableProxy, Config], outage: str,
) -> None:
    """``cut``: the broker unreachable (connections refused and closed); ``frozen``: it
    accepts and never answers (SIGSTOP), where only the poll's bound ends the wait."""
    broker, proxy, config = proxied_app
    poller = Poller(config, None, timeout_s=3.0)
    proc = broker.proc
    assert proc is not None
    try:
        await poller.poll()
        _shows_the_app(poller)
        if outage == "cut":
            await proxy.cut()
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            await wait_until(lambda: process_stopped(proc.pid), 10, what="tansu to stop")
        for _ in range(2):  # the first poll on the kept connections, then on new ones
            started = time.monotonic()
            await poller.poll()
            took = time.monotonic() - started
            assert took < poller.timeout_s + 1.0, f"a poll took {took:.1f}s"
            assert poller.reading.error is not None
            assert poller.reading.apps is not None  # the last good reading stays shown
        if outage == "cut":
            await proxy.start()
        else:
            os.kill(proc.pid, signal.SIGCONT)
        await poller.poll()
        _shows_the_app(poller)
    finally:
        if outage == "frozen":
            os.kill(proc.pid, signal.SIGCONT)
        await poller.stop()


async def test_an_app_the_broker_does_not_know_is_a_404_and_a_known_one_answers(
    proxied_app: tuple[Tansu, CuttableProxy, Config],
) -> None:
    """``?app=shpo`` (a typo) answered 200 with no letter: an app with nothing to fix."""
    _, _, config = proxied_app
    settings = Settings(config, None, None, "127.0.0.1", broker_name(config))
    one_app = Settings(config, "fresh", None, "127.0.0.1", broker_name(config))
    api = TestClient(create_app(settings, Poller(config, None, interval_s=0.2)),
                     base_url="http://127.0.0.1:8089")
    fresh = TestClient(create_app(one_app, Poller(config, "fresh", interval_s=0.2)),
                       base_url="http://127.0.0.1:8089")

    def ask() -> list[tuple[int, Any]]:
        with api, fresh:
            return [(r.status_code, r.json()) for r in (
                api.get("/api/letters", params={"app": "shpo"}),
                api.get("/api/charts", params={"app": "shpo"}),
                api.get("/api/letters", params={"app": "shop"}),
                fresh.get("/api/letters"))]

    unknown, charts, shop, own = await asyncio.to_thread(ask)
    line = ("no app 'shpo' on this broker: it has no consumer group and no dead letters (a "
            "typo, or an app that never ran; apps here: shop)")
    assert unknown == (404, {"error": line})
    assert charts == (404, {"error": line})
    assert (shop[0], shop[1]["total"]) == (200, 1)
    assert (own[0], own[1]["total"]) == (200, 0)  # the console's --app, before it ran


async def test_a_kafka_whose_port_is_closed_is_reported_at_once(topic: str) -> None:
    port = free_port()  # reserved, and nothing listens on it
    poller = Poller(kafka_config(f"127.0.0.1:{port}", topic, queues={"total": 2},
                                 balancer={"kind": "kafka-group"}), None)
    started = time.monotonic()
    try:
        await poller.poll()
    finally:
        await poller.stop()
    assert time.monotonic() - started < 2.0
    assert poller.reading.error == (
        "BrokerConnectionError: kafka: listing consumer groups failed: no broker reachable "
        f"at 127.0.0.1:{port} ($.kafka.bootstrap)")
