"""``idempotent=True`` handlers in process (memory adapter, the in-process store)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conveyor import App, Client, HandlerDeclarationError, MessageContext
from conveyor.platform.delivery.idempotency import Claim, LocalIdempotencyStore
from tests.conftest import wait_until
from tests.integration.memory_harness import Item, daemon, fresh_adapter, publish_items


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_local_store_claims_marks_and_lets_claims_lapse() -> None:
    clock = Clock()
    store = LocalIdempotencyStore(max_keys=3, clock=clock)
    assert await store.claim("h:1", "a", 10) == (Claim.CLAIMED, 0.0)
    assert await store.claim("h:1", "b", 10) == (Claim.BUSY, 10.0)
    assert await store.claim("h:1", "a", 10) == (Claim.CLAIMED, 0.0)  # its own, again
    clock.now = 11.0  # a's claim lapsed (a died)
    assert (await store.claim("h:1", "b", 10))[0] is Claim.CLAIMED
    assert not await store.renew("h:1", "a", 10)
    assert await store.renew("h:1", "b", 10)
    await store.complete("h:1", 100)
    assert (await store.claim("h:1", "c", 10))[0] is Claim.DONE
    await store.release("h:1", "b")  # a release of a done id changes nothing
    assert (await store.claim("h:1", "c", 10))[0] is Claim.DONE
    clock.now = 200.0  # the window passed
    assert (await store.claim("h:1", "c", 10))[0] is Claim.CLAIMED
    for i in range(2, 6):  # bounded: the oldest keys go first
        await store.complete(f"h:{i}", 100)
    assert (await store.claim("h:2", "d", 10))[0] is Claim.CLAIMED


def test_the_options_are_checked_when_the_handler_is_declared() -> None:
    app = App("opts")
    with pytest.raises(HandlerDeclarationError, match="idempotency_claim_s"):
        app.handler("x", idempotent=True, idempotency_claim_s=0)(_noop)
    with pytest.raises(HandlerDeclarationError, match="idempotent=True handlers only"):
        app.handler("x", idempotency_window_s=60)(_noop)


async def _noop(body: bytes) -> None:
    return None


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_rewind_over_completed_messages_runs_none_of_them_again(
    idempotent: bool,
) -> None:
    """Everything handled, then the group rewound to the start: an idempotent handler
    acknowledges the 200 redeliveries without running (deduplicated = 200); a plain one
    runs each twice (the control: what the option prevents)."""
    adapter = fresh_adapter()
    calls: Counter[str] = Counter()
    app = App("once")

    @app.handler("items", idempotent=idempotent)
    async def handle(item: Item, ctx: MessageContext) -> None:
        calls[ctx.message.id] += 1

    first = daemon(app, adapter)
    await first.start()
    try:
        ids = await publish_items(Client(adapter, first.mapper), 200, 20)
        await wait_until(lambda: first.stats.handled >= 200, what="first deliveries")
    finally:
        await first.stop()
    await adapter.rewind_queues(list(range(8)), "once", 0.0)  # as `conveyor rewind` does
    second = daemon(app, adapter)
    await second.start()
    try:
        await wait_until(lambda: second.stats.handled >= 200, what="the redeliveries")
    finally:
        await second.stop()
    assert set(calls) == set(ids)
    if idempotent:
        assert all(n == 1 for n in calls.values())
        assert second.stats.deduplicated == 200
    else:
        assert all(n == 2 for n in calls.values())


async def test_two_deliveries_of_one_id_never_run_at_once() -> None:
    """The same message enqueued on two queues (two agents): the second delivery waits
    for the first, then finds it done and does not run."""
    adapter = fresh_adapter()
    gate = asyncio.Event()
    running: list[str] = []
    ran: Counter[str] = Counter()
    app = App("twice")

    @app.handler("items", idempotent=True)
    async def handle(item: Item, ctx: MessageContext) -> None:
        running.append(ctx.message.id)
        assert len(running) == 1, "two deliveries of one id ran at once"
        await gate.wait()
        ran[ctx.message.id] += 1
        running.remove(ctx.message.id)

    d = daemon(app, adapter)
    store = LocalIdempotencyStore.shared(d.config.memory.broker)  # the daemon's store
    answers: list[Claim] = []
    claim = store.claim

    async def noted(key: str, owner: str, claim_s: float) -> tuple[Claim, float]:
        answer = await claim(key, owner, claim_s)
        answers.append(answer[0])
        return answer

    store.claim = noted  # type: ignore[method-assign]
    await d.start()
    try:
        client = Client(adapter, d.mapper)
        msg = client.build("items", "k", Item(1))
        await adapter.enqueue(0, [msg])
        await adapter.enqueue(1, [msg])
        await wait_until(lambda: len(running) == 1, what="the first delivery running")
        await wait_until(lambda: Claim.BUSY in answers, 5,
                         what="the second delivery told the id is busy")
        assert ran == Counter() and running == [msg.id]  # it waits, it does not run
        gate.set()
        await wait_until(lambda: d.stats.handled >= 2, what="both deliveries finished")
    finally:
        await d.stop()
    assert ran == Counter({msg.id: 1})
    assert d.stats.deduplicated == 1


async def test_a_failing_handler_releases_its_claim_and_is_dead_lettered() -> None:
    adapter = fresh_adapter()
    app = App("fails")
    attempts: Counter[str] = Counter()

    @app.handler("items", idempotent=True, retry_attempts=2, retry_delay_s=0.001)
    async def handle(item: Item, ctx: MessageContext) -> None:
        attempts[ctx.message.id] += 1
        raise ValueError("always")

    for _ in range(2):  # a delivery, then a redelivery after a rewind
        d = daemon(app, adapter)
        await d.start()
        try:
            if not attempts:
                (mid,) = await publish_items(Client(adapter, d.mapper), 1, 1)
            await wait_until(lambda d=d: d.stats.dead_lettered == 1, what="the dead letter")
        finally:
            await d.stop()
        await adapter.rewind_queues(list(range(8)), "fails", 0.0)
    assert attempts[mid] == 4  # both deliveries ran both attempts: no claim was left behind
