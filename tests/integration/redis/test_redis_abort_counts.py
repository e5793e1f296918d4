"""A second stop signal counts what it leaves: the drain line adds up.

``pulled = acked + released + abandoned + lost`` on every stop. A second signal (the
daemon's ``abort``) drops the acknowledgements not confirmed yet — waiting, or in a
call under way — and those messages go to the queue's next owner, run by a handler
here: they are ``abandoned``. They were counted nowhere: in the fault walk a worker sent
SIGTERM twice said ``pulled=7386 acked=220 handled=230 … abandoned=53 … released=7105
moved=0``, 8 short. Here Redis is paused (SIGSTOP) while ten finished messages' XACK is
under way, and the second signal comes then.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from redis.asyncio import Redis

from conveyor import App, Client, Publish, WorkerDaemon, load_config
from conveyor.adapters.redis.keys import Keys
from tests.conftest import process_stopped, wait_until
from tests.integration.redis.conftest import REPO, RedisServer

N = 10


async def gated_daemon(redis_server: RedisServer, name: str
                       ) -> tuple[WorkerDaemon, asyncio.Event, list[int]]:
    """A started daemon of app ``name`` on one queue (the shipped redis.toml) whose N
    messages' handlers wait for the gate, and the list of those started."""
    config = load_config(REPO / "configs" / "redis.toml", environ={
        "CONVEYOR_REDIS__URL": redis_server.url, "CONVEYOR_QUEUES__TOTAL": "1"})
    app = App(name)
    gate = asyncio.Event()
    started: list[int] = []

    @app.handler("items")
    async def handle(body: dict[str, Any]) -> None:
        started.append(body["n"])
        await gate.wait()

    async with Client.from_config(config) as client:
        await client.publish_batch(Publish("items", f"k{n}", {"n": n}) for n in range(N))
    daemon = WorkerDaemon(app, config)
    await daemon.start()
    return daemon, gate, started


async def test_a_second_stop_signal_counts_the_acknowledgements_it_drops_as_abandoned(
    redis_server: RedisServer,
) -> None:
    daemon, gate, started = await gated_daemon(redis_server, "abort-counts")
    server = redis_server.process.proc
    assert server is not None
    paused = False
    try:
        await wait_until(lambda: len(started) == N, 20, what="every message started")
        agent = daemon.agents[0]
        server.send_signal(signal.SIGSTOP)  # the acknowledgement will not be answered
        paused = True
        await wait_until(lambda: process_stopped(server.pid), 10, what="redis to stop")
        gate.set()
        await wait_until(lambda: agent.cache.unconfirmed == N and agent._acks.task is not None,
                         10, what="the ten acknowledgements under way")
        await daemon.abort()  # the second signal
        server.send_signal(signal.SIGCONT)
        paused = False
        report = await daemon.stop()
    finally:
        if paused:
            server.send_signal(signal.SIGCONT)
    assert (report.pulled, report.handled, report.released, report.moved) == (N, N, 0, 0), report
    assert report.acked + report.abandoned == N, f"the drain line does not add up: {report}"
    assert report.abandoned == N, report


async def test_acknowledgements_refused_after_the_lease_moved_are_counted_as_lost(
    redis_server: RedisServer,
) -> None:
    """The fault walk's other leak: a queue whose lease moved (a stalled daemon, a newer
    owner) has its acknowledgements refused by the fence; they were dropped uncounted,
    and the drain line came out short by them. They are the messages the next owner runs
    again, as those held when a lease is lost: counted in ``lost``. Here the lease key is
    given to another owner while ten handlers wait, then the handlers finish."""
    daemon, gate, started = await gated_daemon(redis_server, "refused-acks")
    config = daemon.config
    try:
        await wait_until(lambda: len(started) == N, 20, what="every message started")
        agent = daemon.agents[0]
        redis = Redis.from_url(redis_server.url)
        try:
            lease = Keys(config.redis.prefix).lease("refused-acks", 0)
            assert await redis.exists(lease) == 1
            await redis.set(lease, "another-owner:999", keepttl=True)
        finally:
            await redis.aclose()
        gate.set()
        await wait_until(lambda: agent._acks.fenced, 10, what="the acknowledgements refused")
    finally:
        report = await daemon.stop()
    assert (report.pulled, report.handled, report.acked) == (N, N, 0), report
    assert report.acked + report.released + report.abandoned + report.moved == N, (
        f"the drain line does not add up: {report}")
    assert report.moved == N, report
