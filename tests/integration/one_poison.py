"""What the handler-failure tests share: ``n`` messages on one stream, one of them the
poison, through a :class:`~conveyor.testing.TestWorker`; and an app interceptor that
takes a handler off the shipped one-step chain."""

from __future__ import annotations

from typing import Any

from conveyor import App
from conveyor.platform.delivery.chain import Delivery, Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.testing import Record, TestWorker


class Passing(Interceptor):
    """An app interceptor: the handler's chain is no longer the shipped one-step chain."""

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        async def passing(delivery: Delivery) -> Any:
            return await next(delivery)
        return passing


async def settle_one_poison(app: App, n: int) -> tuple[Record, list[int]]:
    """Publish ``{"seq": 0..n-1}`` to ``items`` on one stream, settle; the one dead
    letter (there must be exactly one) and the seqs handled, sorted."""
    async with TestWorker(app, settle_timeout_s=10.0) as worker:
        for seq in range(n):
            await worker.publish("items", "k", {"seq": seq})
        await worker.settle(raise_on_dead_letters=False)
        [letter] = worker.dead_lettered("items")
        handled = sorted(m.body["seq"] for m in worker.handled("items"))
    return letter, handled
