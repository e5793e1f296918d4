"""What a new owner does with the pending entries it claims from a crashed one: most were
only fetched, never started, and run beside each other at their first counted start;
from the second counted start on, a redelivered message runs alone (see
``PullingAgent._count_start``)."""

from __future__ import annotations

import asyncio
from collections import Counter

from conveyor import App, MessageContext, Publish, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.config import load_config
from tests.conftest import wait_until
from tests.servers import RedisServer

APP = "takeover"
WORK_S = 0.3


async def test_a_crashed_owners_fetched_messages_run_together_and_counted_ones_alone(
    redis_server: RedisServer,
) -> None:
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 1},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "static"},
    })
    app = App(APP)
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    handled: list[tuple[str, str, int]] = []

    async def run(kind: str, body: dict[str, int], ctx: MessageContext) -> None:
        running[kind] += 1
        alone = running["alone"] + running["again"]
        most[kind] = max(most[kind], running[kind])
        most["serial"] = max(most["serial"], alone)
        await asyncio.sleep(WORK_S)
        running[kind] -= 1
        handled.append((kind, ctx.message.stream.key, ctx.deliveries))

    @app.handler("fetched")  # max_deliveries 5: its first counted start runs beside others
    async def fetched(body: dict[str, int], ctx: MessageContext) -> None:
        await run("fetched", body, ctx)

    @app.handler("alone", max_deliveries=3)  # too low a limit to blame it for another
    async def alone(body: dict[str, int], ctx: MessageContext) -> None:
        await run("alone", body, ctx)

    @app.handler("again")  # started once before (counted): runs alone
    async def again(body: dict[str, int], ctx: MessageContext) -> None:
        await run("again", body, ctx)

    daemon = WorkerDaemon(app, config)
    keys = Keys("t")
    stream = keys.queue(0)
    redis = RedisAdapter(config.redis)
    try:
        await daemon.client.publish_batch(
            [Publish("fetched", f"f{i}", {"i": i}) for i in range(20)]
            + [Publish("alone", f"a{i}", {"i": i}) for i in range(4)]
            + [Publish("again", f"g{i}", {"i": i}) for i in range(4)])
        # The crashed owner: it read everything (its pending list) and finished nothing;
        # the "again" messages had one counted start already (a crash before this one).
        await redis.ensure_group(0, APP)
        reply = await redis.redis.xreadgroup(APP, "crashed", {stream: ">"}, 100)
        # The adapter's client leaves this reply unparsed: RESP3 {stream: entries}.
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        assert len(entries) == 28
        for eid, fields in entries:
            if dict(zip(fields[::2], fields[1::2], strict=True))[b"cv-ns"] == b"again":
                await redis.redis.hset(keys.starts(0), f"{APP} {eid.decode()}", 1)
        await daemon.start()
        await wait_until(lambda: len(handled) == 28, 30, what="every claimed message run")
    finally:
        await daemon.stop()
        await redis.close()
    # Each ran once, with its counted start: 2 (its first), 3 for the "again" ones.
    assert sorted(handled) == sorted(
        [("fetched", f"f{i}", 2) for i in range(20)]
        + [("alone", f"a{i}", 2) for i in range(4)]
        + [("again", f"g{i}", 3) for i in range(4)])
    assert most["fetched"] >= 5, most  # one at a time: 1 (20 x 0.3 s); here up to 20
    assert most["serial"] == 1, most  # never two of those at once
