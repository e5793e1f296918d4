"""The bookshop's handlers, tested through Conveyor's real delivery path (conveyor.testing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import bookshop.app
from bookshop.app import Order, Receipt, app
from conveyor.testing import TestWorker
from conveyor.testing.fixtures import worker_fixture

worker = worker_fixture(app)


@pytest.fixture(autouse=True)
def fresh_shop() -> Iterator[None]:
    """The services the handlers call start empty in every test."""
    bookshop.app.gateway = bookshop.app.Gateway()
    bookshop.app.sent.clear()
    yield


async def test_an_order_is_charged_and_its_receipt_sent(worker: TestWorker) -> None:
    await worker.publish("orders", "o-1", Order("o-1", 1200))
    await worker.settle()

    assert bookshop.app.gateway.charged == {"o-1": 1200}
    assert worker.bodies("receipts") == [Receipt("o-1", 1200)]
    assert bookshop.app.sent == ["o-1"]


async def test_a_gateway_timeout_is_retried(worker: TestWorker) -> None:
    bookshop.app.gateway.timeouts_to_come = 2
    await worker.publish("orders", "o-2", Order("o-2", 500))
    await worker.settle()  # no waiting for the declared back-off: the kit skips it

    [order] = worker.handled("orders")
    assert [type(a.error) for a in order.attempts] == [TimeoutError, TimeoutError, type(None)]
    assert bookshop.app.gateway.charged == {"o-2": 500}


async def test_an_order_without_a_total_is_dead_lettered(worker: TestWorker) -> None:
    await worker.publish("orders", "o-3", Order("o-3", 0))
    await worker.settle(raise_on_dead_letters=False)

    [order] = worker.dead_lettered("orders")
    assert order.body == Order("o-3", 0)
    assert order.letter is not None and order.letter.attempts == 3
    assert order.letter.error == "order o-3: the total must be positive"
    assert bookshop.app.gateway.charged == {} and worker.published("receipts") == []


async def test_a_receipt_delivered_twice_is_sent_once(worker: TestWorker) -> None:
    await worker.publish("orders", "o-4", Order("o-4", 300))
    await worker.settle()
    [receipt] = worker.published("receipts")

    await worker.redeliver(receipt)  # as after a crash
    await worker.settle()

    assert bookshop.app.sent == ["o-4"]
    assert len(worker.deduplicated("receipts")) == 1
