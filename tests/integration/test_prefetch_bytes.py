"""``[worker] prefetch_bytes`` on the embedded adapter: what a daemon holds pulled and not
acknowledged stays within its byte budget, shared by its queues, and a batch handler
does not wait out its ``batch_wait_ms`` for messages the byte bound holds back."""

from __future__ import annotations

import asyncio
from collections import Counter

from conveyor import App, Client, Publish
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter

KIB = 1 << 10
BODY = 100 * KIB
BUDGET = 1 << 20  # 1 MiB per daemon: 128 KiB a queue over 8, 10 bodies on one


def bodies(n: int, streams: int) -> list[Publish]:
    return [Publish("big", f"s{i % streams}", {"seq": i, "pad": "x" * (BODY - 30)})
            for i in range(n)]


async def held_within_the_budget(items: list[Publish], largest: int) -> None:
    """Publish ``items`` to handlers that wait, check what the daemon holds once every
    queue pulled — bodies and headers, counted here from its entries — is within the
    budget plus one message (of at most ``largest`` bytes) per queue, then release them:
    each is handled once."""
    adapter = fresh_adapter()
    app = App("test")
    gate = asyncio.Event()
    seen: Counter[int] = Counter()

    @app.handler("big")
    async def on_big(body: dict[str, object]) -> None:
        await gate.wait()
        seen[int(body["seq"])] += 1  # type: ignore[call-overload]

    d = daemon(app, adapter, config(worker={"prefetch_bytes": BUDGET}, slots={"count": 200}))
    await Client(adapter, d.mapper).publish_batch(items)
    await d.start()
    try:
        await wait_until(lambda: all(len(a.cache) > 0 for a in d.agents.values()), 10,
                         what="every queue pulled")
        for _ in range(20):  # the agents would pull more now if they could
            await asyncio.sleep(0)
        held = sum(len(e.msg.body) + sum(len(n) + len(v) for n, v in e.msg.headers.items())
                   for a in d.agents.values() for e in a.cache.entries)
        assert held == sum(a.cache.bytes for a in d.agents.values())
        assert held <= BUDGET + len(d.agents) * largest, held  # one message a queue over
        assert sum(len(a.cache) for a in d.agents.values()) < len(items)
        gate.set()
        await wait_until(lambda: sum(seen.values()) == len(items), 30, what="all handled")
    finally:
        report = await d.stop()
    assert seen == Counter(range(len(items)))  # each once: no fault, no duplicate allowed
    assert report.acked == len(items)


async def test_what_a_daemon_holds_stays_within_its_share_of_prefetch_bytes() -> None:
    await held_within_the_budget(bodies(400, streams=400), BODY)  # one stream each


async def test_large_headers_count_against_prefetch_bytes_as_bodies_do() -> None:
    """Small bodies with 60 KiB of headers each (a client sends up to 64 KiB): before,
    only bodies counted, and every queue pulled its whole backlog (400 messages, 24 MB)
    past a 1 MiB budget."""
    pad = {"x-pad": "x" * (60 * KIB)}
    await held_within_the_budget(
        [Publish("big", f"s{i}", {"seq": i}, headers=pad) for i in range(400)], 61 * KIB)


async def test_a_batch_handler_runs_what_the_byte_bound_lets_in_without_waiting_out_its_wait(
) -> None:
    adapter = fresh_adapter()
    app = App("test")
    batches: list[int] = []

    @app.handler("big", batch_size=100, batch_wait_ms=30_000)
    async def on_big(batch: list[dict[str, object]]) -> None:
        batches.append(len(batch))

    cfg = config(queues={"total": 1}, worker={"prefetch_bytes": BUDGET})
    d = daemon(app, adapter, cfg)
    await Client(adapter, d.mapper).publish_batch(bodies(50, streams=5))
    await d.start()
    try:  # a 30 s wait per batch would take minutes
        await wait_until(lambda: sum(batches) == 50, 10, what="all 50 handled")
    finally:
        await d.stop()
    assert max(batches) <= BUDGET // BODY + 1
