"""A handler declared on an app once a daemon runs it: refused where it is declared.

A daemon runs the handlers its app had when it was made; one declared later was never
called, and its messages were skipped as of a namespace no handler subscribes to."""

from __future__ import annotations

import pytest

from conveyor import App, HandlerDeclarationError
from conveyor.testing import TestWorker
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter


async def test_a_handler_declared_while_a_daemon_runs_its_app_is_refused() -> None:
    app = App("late")
    handled: list[bytes] = []

    @app.handler("orders")
    async def on_order(body: bytes) -> None:
        handled.append(body)

    async def on_refund(body: bytes) -> None:
        raise AssertionError("never declared, never called")

    d = daemon(app, fresh_adapter(), config())
    with pytest.raises(HandlerDeclarationError) as made:
        app.handler("refunds")(on_refund)  # made, not started: it too runs on_order only
    await d.start()
    try:
        with pytest.raises(HandlerDeclarationError) as running:
            app.handler("refunds")(on_refund)
        await d.client.publish("orders", "o-1", b"one")
        await wait_until(lambda: handled == [b"one"], 10, what="the order handled")
    finally:
        await d.stop()
    assert [spec.name.rpartition(".")[2] for spec in app.handlers] == ["on_order"]
    for error in (made.value, running.value):
        assert str(error).endswith(
            "on_refund': app 'late' is run by a worker daemon already, which runs the "
            "handlers declared before it was made: this one would never be called; declare "
            "it first (at import, as `conveyor worker` sees them)"), str(error)
    # once the daemon stopped, the app takes handlers again (for the next daemon)
    app.handler("refunds")(on_refund)
    assert len(app.handlers) == 2


async def test_a_handler_declared_while_a_test_worker_runs_its_app_is_refused() -> None:
    app = App("late-kit")

    @app.handler("orders")
    async def on_order(body: bytes) -> None:
        assert body

    async def on_refund(body: bytes) -> None:
        raise AssertionError("never declared, never called")

    async with TestWorker(app) as worker:
        with pytest.raises(HandlerDeclarationError, match="run by a worker daemon already"):
            app.handler("refunds")(on_refund)
        await worker.publish("orders", "o-1", b"x")
        [record] = await worker.settle()
    assert record.handler.rpartition(".")[2] == "on_order"
    app.handler("refunds")(on_refund)  # stopped: taken
