"""serve(): how `conveyor worker` and a supervised child run one daemon until told to stop.

Signals here are SIGUSR1 sent to this process: serve() installs its handler before the
daemon starts, and SIGINT / SIGTERM stay pytest's.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from conveyor import App, Client
from conveyor.platform.acks import Acknowledger
from conveyor.platform.errors import ConfigError, ConveyorError, ShutdownError
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.serve import serve
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Record,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)

SIGNALS = (signal.SIGUSR1,)


def recording_daemon(record: Record) -> WorkerDaemon:
    return daemon(recording_app(record), fresh_adapter())


async def test_a_signal_drains_the_daemon_and_serve_returns_its_drain_report() -> None:
    record = Record()
    d = recording_daemon(record)
    await publish_items(Client(d.adapter, d.mapper), 50, streams=5)
    events: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def signal_once_handled() -> None:
        await wait_until(lambda: record.handled == 50, 10, what="all 50 handled")
        os.kill(os.getpid(), signal.SIGUSR1)

    def ready() -> None:
        events.append(f"ready, started={d.started}")
        tasks.append(asyncio.create_task(signal_once_handled()))

    report = await serve(d, ready=ready, signals=SIGNALS, freeze_heap=False)
    assert events == ["ready, started=True"] and tasks[0].done()
    assert (report.pulled, report.acked, report.handled, report.abandoned) == (50, 50, 50, 0)
    assert not d.started and d.agents == {}  # stopped: every queue released


@pytest.mark.parametrize(
    ("error", "raised"),
    [(ConfigError("no such group protocol"), ConfigError), (OSError("gone"), ConveyorError)],
)
async def test_a_daemon_that_fails_is_stopped_and_its_failure_raised(
    error: BaseException, raised: type[ConveyorError]
) -> None:
    d = recording_daemon(Record())

    with pytest.raises(raised, match=str(error)):
        await serve(d, ready=lambda: d.balancer_failed(error), signals=SIGNALS,
                    freeze_heap=False)
    assert not d.started and d.agents == {}


async def test_commands_returning_stop_the_daemon() -> None:
    d = recording_daemon(Record())
    seen: list[str] = []

    async def commands() -> None:
        seen.append("stop command")

    report = await serve(d, commands=commands, signals=SIGNALS, freeze_heap=False)
    assert seen == ["stop command"] and report.pulled == 0 and not d.started


async def test_a_signal_cancels_commands_and_waits_for_them_before_stopping() -> None:
    """A supervised child's queue moves finish before its daemon stops."""
    d = recording_daemon(Record())
    finished: list[bool] = []

    async def commands() -> None:
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            await asyncio.Event().wait()  # reading the supervisor's next command
        finally:
            await asyncio.sleep(0)  # a move under way completes
            finished.append(d.started)

    await serve(d, commands=commands, signals=SIGNALS, freeze_heap=False)
    assert finished == [True]  # they finished while the daemon still ran
    assert not d.started


async def test_an_agent_task_that_crashes_fails_the_daemon_and_a_restart_redelivers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An error of Conveyor's own in a runner (here injected into the acknowledgement
    # bookkeeping right after a handler call): the runner used to end with a log line
    # alone, its message unfinished and the queue's acknowledgements stopped behind it
    # until someone restarted the worker. Now the daemon fails, serve() drains it and
    # raises, and the next daemon on the queues gets what the first did not acknowledge.
    record = Record()
    adapter = fresh_adapter()
    first = daemon(recording_app(record), adapter)
    ids = await publish_items(Client(adapter, first.mapper), 40, streams=4)
    crashed: list[str] = []
    real_head_done = Acknowledger.head_done

    def head_done(self: Acknowledger) -> None:
        if not crashed:
            crashed.append("once")
            raise RuntimeError("a bug in the bookkeeping")
        real_head_done(self)

    monkeypatch.setattr(Acknowledger, "head_done", head_done)
    with pytest.raises(ConveyorError, match=r"queue \d+: an agent task crashed "
                                            r"\(RuntimeError: a bug in the bookkeeping\)"):
        async with asyncio.timeout(10):
            await serve(first, signals=SIGNALS, freeze_heap=False)
    assert crashed == ["once"] and not first.started
    monkeypatch.undo()

    second = daemon(recording_app(record), adapter)
    await second.start()
    try:
        await wait_until(lambda: record.handled == len(ids), 10, what="every message handled")
    finally:
        await second.stop()
    # Every message published was handled; the one whose bookkeeping crashed ran in
    # both daemons (its handler had returned when the runner crashed, and it was never
    # acknowledged): one duplicate at most, and only that one.
    assert sorted(record.calls) == sorted(ids)
    assert record.duplicates <= 1
    assert [key for key, order in record.order.items() if order != sorted(order)] == []


async def test_a_daemon_started_twice_or_after_its_stop_refuses_in_one_line() -> None:
    # A second start joined the balancer again; a start after stop() returned as though
    # it had started, and the daemon handled nothing (its adapter and client closed).
    app = App("twice")

    @app.handler("n")
    async def take(body: dict[str, int]) -> None:
        """Handled."""

    d = daemon(app, fresh_adapter())
    await d.start()
    with pytest.raises(ConveyorError) as again:
        await d.start()
    await d.stop()
    with pytest.raises(ShutdownError) as after:
        await d.start()
    assert str(again.value) == ("this WorkerDaemon is started already: start it once "
                                "(stop() then drains it)")
    assert str(after.value) == ("this WorkerDaemon is stopped: a daemon starts once "
                                "(make a new WorkerDaemon to start again)")
