"""Leaving a ``TestWorker`` block: a test that published and ended without ``settle()``
has what it published settled at the exit, and a dead letter the test never looked at
fails it, with the handler's exception as the cause. A test that settled, expected its
dead letters or failed on its own is left as it was."""

from __future__ import annotations

import asyncio
import sys
import time
import unittest

import pytest

import conveyor
from conveyor.testing import (
    DeadLettersFound,
    NotSettled,
    StartupHookFailed,
    TestWorker,
    WorkerStopped,
)
from tests.conftest import wait_until

app = conveyor.App("exit-check")
handled: list[str] = []
gate = asyncio.Event()


@app.handler("orders", retry_attempts=2)
async def on_order(order: dict[str, int]) -> None:
    if order["items"] == 0:
        raise ZeroDivisionError("an order of no items")
    handled.append(f"o-{order['items']}")


@app.handler("slow")
async def on_slow(body: str) -> None:
    await gate.wait()


@pytest.fixture(autouse=True)
def fresh() -> None:
    handled.clear()
    gate.clear()


async def test_a_dead_letter_no_settle_reported_fails_the_exit() -> None:
    with pytest.raises(DeadLettersFound) as raised:
        async with TestWorker(app) as worker:
            await worker.publish("orders", "o-1", {"items": 1})
            await worker.publish("orders", "o-0", {"items": 0})
    message = str(raised.value)
    assert message.startswith("1 message(s) dead-lettered that the test never looked at")
    assert "dead-lettered orders/o-0 on_order, 2 attempts: ZeroDivisionError" in message
    assert isinstance(raised.value.__cause__, ZeroDivisionError)
    assert [r.key for r in raised.value.records] == ["o-0"]
    assert handled == ["o-1"]  # settled at the exit: the good one ran too
    assert worker.drain_report is not None  # and the worker stopped


async def test_what_the_test_published_is_settled_at_the_exit() -> None:
    async with TestWorker(app) as worker:
        await worker.publish_batch(conveyor.Publish("orders", f"o-{n}", {"items": n})
                                   for n in (1, 2, 3))
    assert sorted(handled) == ["o-1", "o-2", "o-3"]
    assert sorted(r.key for r in worker.handled()) == ["o-1", "o-2", "o-3"]


async def test_dead_letters_the_test_expected_or_read_pass_the_exit() -> None:
    async with TestWorker(app) as worker:
        await worker.publish("orders", "o-0", {"items": 0})
        await worker.settle(raise_on_dead_letters=False)
    async with TestWorker(app) as worker:
        await worker.publish("orders", "o-0", {"items": 0})
        with pytest.raises(DeadLettersFound):
            await worker.settle()
    async with TestWorker(app) as other:
        await other.publish("orders", "o-0", {"items": 0})
        # the test's own wait, reading what it checks
        await wait_until(lambda: bool(other.dead_lettered()), 10, what="the dead letter")
        seen = len(other.dead_lettered())
    assert (len(worker.dead_lettered()), seen) == (1, 1)


async def test_a_test_that_failed_keeps_its_own_error() -> None:
    with pytest.raises(KeyError, match="the test's own"):
        async with TestWorker(app) as worker:
            await worker.publish("orders", "o-0", {"items": 0})
            raise KeyError("the test's own")
    assert worker.drain_report is not None


async def test_work_left_stuck_is_named_at_the_exit_unless_the_test_asked() -> None:
    start = time.monotonic()
    with pytest.raises(NotSettled, match="slow/s-1"):
        async with TestWorker(app, settle_timeout_s=0.3, stop_timeout_s=0.3) as worker:
            await worker.publish("slow", "s-1", "x")
    assert time.monotonic() - start < 5  # the settle and the drain's timeouts, not more
    async with TestWorker(app, settle_timeout_s=0.3) as worker:
        await worker.publish("slow", "s-2", "x")
        with pytest.raises(NotSettled):
            await worker.settle()
        gate.set()  # the handler returns as the worker stops
    assert worker.unsettled() == []



async def test_what_worker_client_published_is_settled_and_checked_at_the_exit() -> None:
    """``worker.client`` is the hooks' client: publishing with it is publishing here, so a
    dead letter of what it published fails the exit as one of ``worker.publish`` does."""
    with pytest.raises(DeadLettersFound, match="orders/o-0 on_order"):
        async with TestWorker(app) as worker:
            await worker.client.publish("orders", "o-1", {"items": 1})
            await worker.client.publish("orders", "o-0", {"items": 0})
    assert handled == ["o-1"]


async def test_a_startup_hook_no_settle_saw_is_waited_for_and_its_failure_raised() -> None:
    """A test that never settles still fails on a startup hook that raised, and on what
    the hook published (the hook may not have run at all when the test ends)."""
    broken = conveyor.App("exit-hooks")

    @broken.startup
    async def connect(client: conveyor.Client) -> None:
        raise ConnectionError("the database is down")

    bodies = []
    with pytest.raises(StartupHookFailed, match="connect raised ConnectionError") as raised:
        async with TestWorker(broken) as worker:
            bodies.append(worker)  # the test's body ran; its exit raised
    assert len(bodies) == 1
    assert isinstance(raised.value.__cause__, ConnectionError)

    seeding = conveyor.App("exit-hooks")
    seeding.handler("orders", retry_attempts=2)(on_order)

    @seeding.startup
    async def seed(client: conveyor.Client) -> None:
        await client.publish("orders", "o-0", {"items": 0})

    bodies.clear()
    with pytest.raises(DeadLettersFound, match="orders/o-0 on_order"):
        async with TestWorker(seeding) as worker:
            bodies.append(worker)
    assert len(bodies) == 1


async def test_a_worker_that_stopped_on_its_own_fails_the_exit_unless_a_settle_said_so(
) -> None:
    """The daemon failing (an agent task crashed: conveyor worker exits 1) after the
    test's last settle(), or a handler's sys.exit() only unsettled() looked at, passed
    the exit silently: nothing raised it, the exit settling nothing new."""
    stopping = conveyor.App("exit-stops")

    @stopping.handler("fatal")
    async def fatal(code: int) -> None:
        sys.exit(code)

    stopping.handler("orders")(on_order)
    with pytest.raises(WorkerStopped, match="the worker failed: queue 0: ") as failed:
        async with TestWorker(stopping) as worker:
            await worker.publish("orders", "o-1", {"items": 1})
            await worker.settle()
            worker.daemon.agent_crashed(0, RuntimeError("boom"))  # as the agent reports it
    assert failed.value.__cause__ is worker.daemon.failure
    with pytest.raises(WorkerStopped, match="the worker failed: "):
        async with TestWorker(stopping) as worker:  # nothing published at all
            worker.daemon.agent_crashed(0, RuntimeError("boom"))
    with pytest.raises(WorkerStopped, match=r"handler fatal raised SystemExit\(3\)") as held:
        async with TestWorker(stopping, stop_timeout_s=0.3) as worker:
            await worker.publish("fatal", "f", 3)
            await wait_until(lambda: "held" in "".join(worker.unsettled()), 10,
                             what="the call held")
    assert isinstance(held.value.__cause__, SystemExit)
    async with TestWorker(stopping, stop_timeout_s=0.3) as worker:  # said once: enough
        await worker.publish("fatal", "f", 3)
        with pytest.raises(WorkerStopped):
            await worker.settle()
    async with TestWorker(stopping) as worker:
        worker.daemon.agent_crashed(0, RuntimeError("boom"))
        with pytest.raises(WorkerStopped):
            await worker.settle()


class UnittestCase(unittest.IsolatedAsyncioTestCase):
    """docs/testing.md's unittest way: the worker entered in asyncSetUp, exited (settled
    and checked) at the test's cleanup. Run by the test below, not collected itself."""

    __test__ = False

    async def asyncSetUp(self) -> None:
        self.worker = await self.enterAsyncContext(TestWorker(app))

    async def test_settles(self) -> None:
        await self.worker.publish("orders", "o-1", {"items": 1})
        await self.worker.settle()
        self.assertEqual(self.worker.bodies("orders"), [{"items": 1}])

    async def test_forgets_to_settle(self) -> None:
        await self.worker.publish("orders", "o-2", {"items": 0})


def test_a_unittest_case_gets_the_exit_check_at_its_cleanup() -> None:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(UnittestCase).run(result)
    assert result.testsRun == 2 and not result.errors, result.errors
    [(failed, trace)] = result.failures
    assert failed.id().endswith("test_forgets_to_settle")
    assert "DeadLettersFound: 1 message(s) dead-lettered that the test never looked at" in trace
    assert handled == ["o-1"]
