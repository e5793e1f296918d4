"""A second stop signal counts what it leaves: the drain line adds up.

``pulled = acked + released + abandoned + lost`` on every stop. A second signal (the
daemon's ``abort``) drops the acknowledgements not confirmed yet — waiting, or in a
call under way — and those messages go to the queue's next owner, run by a handler
here: they are ``abandoned``. They were counted nowhere: in the fault walk a worker sent
SIGTERM twice said ``pulled=7386 acked=220 handled=230 … abandoned=53 … released=7105
lost=0``, 8 short. Here Redis is paused (SIGSTOP) while ten finished messages' XACK is
under way, and the second signal comes then.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from conveyor import App, Client, Publish, WorkerDaemon, load_config
from tests.conftest import wait_until
from tests.integration.redis.conftest import REPO, RedisServer

N = 10


async def test_a_second_stop_signal_counts_the_acknowledgements_it_drops_as_abandoned(
    redis_server: RedisServer,
) -> None:
    config = load_config(REPO / "configs" / "redis.toml", environ={
        "CONVEYOR_REDIS__URL": redis_server.url, "CONVEYOR_QUEUES__TOTAL": "1"})
    app = App("abort-counts")
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
    server = redis_server.process.proc
    assert server is not None
    paused = False
    try:
        await wait_until(lambda: len(started) == N, 20, what="every message started")
        agent = daemon.agents[0]
        server.send_signal(signal.SIGSTOP)  # the acknowledgement will not be answered
        paused = True
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
    assert (report.pulled, report.handled, report.released, report.lost) == (N, N, 0, 0), report
    assert report.acked + report.abandoned == N, f"the drain line does not add up: {report}"
    assert report.abandoned == N, report
