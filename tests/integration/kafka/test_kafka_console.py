"""The console's JSON on tansu under both balancers: the app found by its group, its
queues and lag, and its running daemon with what its heartbeat carries (version, ready) —
from the daemon's reports on ``kafka-group``, from the membership store on ``dynamic``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.testclient import TestClient

import conveyor
from conveyor.client import Publish
from conveyor.console.poller import Poller
from conveyor.console.server import Settings, broker_name, create_app
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config, nothing_left_unacknowledged
from tests.servers import RedisServer

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
