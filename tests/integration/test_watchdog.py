"""The loop watchdog on the embedded adapter: a handler that blocks its event loop is
named (handler, message, stack) and counted; one that does not is not."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time

import pytest

from conveyor import App, Publish
from conveyor.platform.config import Config, QueuesConfig, WorkerConfig
from conveyor.platform.terminal import VisibleFormatter
from conveyor.testing import TestWorker
from tests.conftest import wait_until


def blocking_app() -> App:
    app = App("stall")

    @app.handler("jobs")
    async def on_job(body: dict[str, float]) -> None:
        if body["block_s"]:
            time.sleep(body["block_s"])  # noqa: ASYNC251 - the mistake under test

    return app


async def test_a_handler_blocking_the_loop_is_named_with_its_message_and_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = Config(worker=WorkerConfig(stall_warn_ms=200))
    with caplog.at_level(logging.WARNING, logger="conveyor.watchdog"):
        async with TestWorker(blocking_app(), config) as worker:
            [quick] = [await worker.publish("jobs", "a", {"block_s": 0.0})]
            await worker.settle()
            assert worker.daemon._parts.watchdog.stalls == 0
            blocker = await worker.publish("jobs", "b", {"block_s": 0.6})
            second = await worker.publish("jobs", "c", {"block_s": 0.6})
            await worker.settle()
            watchdog = worker.daemon._parts.watchdog
            # Two blockers in a row are two stalls, not one of 1.2 s: the runner yields
            # between them so the probe gets through.
            assert watchdog.stalls == 2, (watchdog.stalls, watchdog.longest_s, worker.report())
            assert 0.5 <= watchdog.longest_s < 1.1, watchdog.longest_s
    assert quick.id not in caplog.text
    records = [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(records) == 1, records  # the second stall of the same handler is counted, not logged
    [record] = records
    line = record.getMessage()
    assert "handler tests.integration.test_watchdog.on_job" in line or "on_job" in line
    assert blocker.id in line or second.id in line
    assert "time.sleep" in line and "test_watchdog.py" in line
    # As `conveyor worker` prints it (docs/handlers.md): the stack a frame a line, its
    # newlines not escaped as a producer's value's are.
    shown = VisibleFormatter("%(message)s").format(record).splitlines()
    assert shown[-1].strip().startswith("time.sleep(body"), shown
    assert not any("\\n" in x for x in shown), shown


def restalling_app(seen: list[str], *, beat_turns: int, then_held_s: float) -> App:
    """Each message blocks the loop, then the loop is blocked again by something else
    (another queue's blocker, here a callback) while a heartbeat's timer comes due; the
    beat is recorded ``beat_turns`` turns of the loop after its timer (aiokafka's takes a
    few, from the answer read to the next request sent). ``then_held_s``: the loop is
    held that long (below the watchdog's threshold) right after the second stall, as
    when the process is descheduled."""
    app = App("restall")
    beats: set[asyncio.Task[None]] = set()

    async def beat() -> None:  # a task waking from a sleep, as aiokafka's heartbeat does
        await asyncio.sleep(0.02)
        for _ in range(beat_turns):
            await asyncio.sleep(0)
        seen.append("beat")

    def stall(stall_s: float) -> None:
        time.sleep(stall_s)
        seen.append("stall ended")
        if then_held_s:
            asyncio.get_running_loop().call_soon(time.sleep, then_held_s)

    @app.handler("jobs")
    async def on_job(body: dict[str, float]) -> None:
        seen.append("start")
        time.sleep(body["block_s"])  # noqa: ASYNC251 - the mistake under test
        loop = asyncio.get_running_loop()
        beats.add(loop.create_task(beat()))  # its sleep begins before the next stall
        loop.call_soon(stall, body["block_s"])

    return app


async def run_two_blockers(app: App, seen: list[str], *, stalls: int) -> None:
    """Two messages of 0.6 s blockers on one queue and two streams (both in the cache
    while the first runs), each handled once, the watchdog counting ``stalls``."""
    config = Config(queues=QueuesConfig(total=1), worker=WorkerConfig(stall_warn_ms=200))
    async with TestWorker(app, config) as worker:
        await worker.publish_batch([Publish("jobs", "a", {"block_s": 0.6}),
                                    Publish("jobs", "b", {"block_s": 0.6})])
        await worker.settle()
        await wait_until(lambda: seen.count("beat") == 2, 5, 0.01, "both beats")
        watchdog = worker.daemon._parts.watchdog
        assert watchdog.stalls == stalls, (watchdog.stalls, watchdog.longest_s)
        assert watchdog.longest_s < 1.1, watchdog.longest_s
        assert len(worker.handled("jobs")) == 2  # each once


RESTALLED = ["start", "stall ended", "beat", "start", "stall ended", "beat"]


async def test_after_a_stall_a_timer_it_held_up_runs_before_the_next_handler_starts() -> None:
    # The runner waiting to start the second message began its wait (10 ms) after the
    # first blocker; that wait ran out inside the next stall, and waking first after it,
    # the runner started its blocker before the timers due meanwhile. On kafka-group that
    # timer is the heartbeat's: two 3 s blockers left 6.01 s between heartbeats, past the
    # 6 s session, and the group could re-balance (non-blocking messages handled twice,
    # tests/integration/kafka/test_kafka_blocking_handlers.py).
    seen: list[str] = []
    await run_two_blockers(restalling_app(seen, beat_turns=0, then_held_s=0.0), seen, stalls=4)
    assert seen == RESTALLED, seen


async def test_after_a_stall_the_loop_turns_before_the_next_start_however_late_it_woke() -> None:
    # The process descheduled (here: the loop held 30 ms, unflagged) right after a stall:
    # the 10 ms are spent when the runner wakes, the heartbeat task woken with it still
    # has turns to go before its request is sent. The runner lets the loop turn first.
    seen: list[str] = []
    await run_two_blockers(restalling_app(seen, beat_turns=3, then_held_s=0.03), seen, stalls=4)
    assert seen == RESTALLED, seen


async def test_batches_that_block_the_loop_one_after_another_are_separate_stalls() -> None:
    # A batch handler's batches ran back to back without yielding: two 0.6 s batches
    # were one 1.2 s stall, and a heartbeat due after the first waited for the last (on
    # kafka-group, two 3 s batches cost the partitions). Between two batches the loop
    # now breathes as between two runs of a plain handler.
    seen: list[str] = []
    app = App("stallbatch")

    @app.handler("jobs", batch_size=1, batch_wait_ms=1)
    async def on_jobs(batch: list[dict[str, float]]) -> None:
        seen.append("start")
        asyncio.get_running_loop().call_later(0.02, seen.append, "beat")  # due in the stall
        time.sleep(batch[0]["block_s"])  # noqa: ASYNC251 - the mistake under test

    await run_two_blockers(app, seen, stalls=2)
    assert seen == ["start", "beat", "start", "beat"], seen


async def test_a_broker_error_just_after_a_stall_names_the_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A read whose deadline passed during a stall times out as the loop resumes (the
    # answer maybe already in the socket): its "unreachable" line says so, instead of
    # blaming the broker alone.
    from conveyor.platform.outage import OutageLog
    from conveyor.platform.watchdog import LoopWatchdog, stall_note

    watchdog = LoopWatchdog(threshold_s=0.2, probe_interval_s=0.05)
    watchdog.start()
    try:
        time.sleep(0.5)  # noqa: ASYNC251 - the stall under test
        await wait_until(lambda: watchdog.stalls == 1, 5, 0.01, "the probe answered")
        outage = OutageLog(logging.getLogger("tests.outage"), "redis", "redis://h:1/0", 30)
        with caplog.at_level(logging.WARNING, logger="tests.outage"):
            outage.failing("reading queue 0", TimeoutError("Timeout reading from h:1"))
        [line] = [r.getMessage() for r in caplog.records if r.name == "tests.outage"]
        assert line.startswith("redis at redis://h:1/0 unreachable while reading queue 0 "
                               "(Timeout reading from h:1) — just after the event loop was "
                               "blocked 0.")
        assert line.endswith("a timeout then is likely the stall's, not the broker's; "
                             "retrying with back-off")
        assert stall_note(within_s=0.0) == ""  # longer ago than that: no note
    finally:
        watchdog.stop()


def gil_app(held: list[str]) -> App:
    app = App("gil")

    @app.handler("jobs")
    def on_job(body: dict[str, int]) -> None:
        # libc's usleep called holding the GIL (PyDLL does not release it): what a long
        # regex match or a C extension that keeps the GIL does, for a known time.
        ctypes.PyDLL(None).usleep(body["hold_us"])
        held.append(threading.current_thread().name)

    return app


async def test_a_def_handler_holding_the_gil_is_named_though_it_held_the_watchdog_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing was logged or counted: the watchdog's thread was held with the rest, and
    # the probe it could not post found the loop free once the GIL came back. The lease
    # renewals are held the same way: past the lease, such a stall cost the queues
    # with no line saying why (and "the server lost it" lines blaming Redis).
    held: list[str] = []
    config = Config(worker=WorkerConfig(stall_warn_ms=200))
    with caplog.at_level(logging.WARNING, logger="conveyor.watchdog"):
        async with TestWorker(gil_app(held), config) as worker:
            await worker.publish("jobs", "a", {"hold_us": 800_000})
            await worker.settle()
            watchdog = worker.daemon._parts.watchdog
            await wait_until(lambda: watchdog.stalls == 1, 5, 0.01, "the stall counted")
            assert 0.6 <= watchdog.longest_s < 2.0, watchdog.longest_s
    assert len(held) == 1 and held[0].startswith("conveyor-handler"), held
    [line] = [r.getMessage() for r in caplog.records if r.name == "conveyor.watchdog"]
    assert line.startswith("the whole process was held for "), line
    assert "a thread held the GIL" in line, line
    assert "lease renewals and heartbeats were held as well" in line, line
