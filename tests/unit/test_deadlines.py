"""StallTolerantTimeout keeps asyncio.timeout's contract where the loop is not blocked:
a deadline that passes raises TimeoutError, a cancellation from elsewhere stays a
cancellation, no deadline means none. What a stall changes is tested against a real
socket here and a real Redis in tests/integration/redis/test_redis_stall_deadlines.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from conveyor.platform.deadlines import GRACE_S, MAX_PUT_OFFS, StallTolerantTimeout, TaskDeadlines


async def test_a_deadline_that_passes_on_a_running_loop_raises_timeout_error_on_time() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with StallTolerantTimeout(0.1) as deadline:
            await asyncio.sleep(5)
    assert deadline.expired
    assert 0.09 < time.monotonic() - started < 1.0  # not the sleep's 5 s


async def test_a_call_that_ends_in_time_is_left_alone() -> None:
    async with StallTolerantTimeout(0.2) as deadline:
        await asyncio.sleep(0.01)
    assert not deadline.expired
    await asyncio.sleep(0.3)  # the deadline's callback was cancelled: nothing fires


async def test_no_deadline_never_fires() -> None:
    async with StallTolerantTimeout(None) as deadline:
        await asyncio.sleep(0.05)
    assert not deadline.expired


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def call() -> None:
        async with StallTolerantTimeout(5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("stall_s", [0.6, 0.4])
async def test_a_reply_that_arrives_while_the_loop_is_blocked_past_the_deadline_is_read(
    stall_s: float,
) -> None:
    """A peer thread answers 0.1 s into a stall of the loop; the deadline is 0.3 s.
    asyncio.timeout cancels the read as the loop resumes; this one lets it in — also
    when the stall ends less than ``LATE_S`` after the deadline (0.4 s: about 0.1 s)."""

    def answering(delay_s: float) -> int:
        listener = socket.create_server(("127.0.0.1", 0))

        def answer() -> None:
            conn, _ = listener.accept()
            conn.recv(16)
            time.sleep(delay_s)
            conn.sendall(b"pong\n")
            time.sleep(2)
            conn.close()
            listener.close()

        threading.Thread(target=answer, daemon=True).start()
        return int(listener.getsockname()[1])

    async def read_during_stall(tolerant: bool) -> bytes | str:
        port = answering(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping\n")
        await writer.drain()
        asyncio.get_running_loop().call_later(0.01, time.sleep, stall_s)
        try:
            async with (StallTolerantTimeout(0.3) if tolerant else asyncio.timeout(0.3)):
                return await reader.readline()
        except TimeoutError:
            return "timeout"
        finally:
            writer.close()

    assert await read_during_stall(tolerant=False) == "timeout"
    assert await read_during_stall(tolerant=True) == b"pong\n"


async def test_a_deadline_already_past_expires_at_once() -> None:
    """A negative delay is due now (as with asyncio.timeout), not a stall put off."""
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with StallTolerantTimeout(-1.0):
            await asyncio.sleep(5)
    assert time.monotonic() - started < GRACE_S


async def test_a_reused_deadline_does_not_uncancel_for_its_last_use() -> None:
    deadline = StallTolerantTimeout(0.01)
    with pytest.raises(TimeoutError):
        async with deadline:
            await asyncio.sleep(5)
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # a cancellation of this task pending while the deadline is reused
    reused = False
    async with deadline:
        reused = True
    assert reused
    assert task.cancelling() == 1  # still counted: the caller's, not the deadline's
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(0)
    task.uncancel()


async def test_a_loop_that_keeps_stalling_puts_a_deadline_off_only_so_often() -> None:
    """Blockers of 0.6 s with 10 ms between them, for 4.2 s; a 0.05 s deadline on a call
    that never ends. Each stall hides the deadline again: without a bound it would fire
    only 0.25 s after the last blocker (~4.5 s); it fails after MAX_PUT_OFFS + 1 stalls."""
    loop = asyncio.get_running_loop()
    blocking_until = time.monotonic() + 4.2
    blockers_done = asyncio.Event()

    def blocker() -> None:
        time.sleep(0.6)
        if time.monotonic() < blocking_until:
            loop.call_later(0.01, blocker)
        else:
            blockers_done.set()

    loop.call_later(0.01, blocker)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with StallTolerantTimeout(0.05):
            await asyncio.Event().wait()
    took_s = time.monotonic() - started
    assert (MAX_PUT_OFFS + 1) * 0.6 - 0.1 < took_s < 4.0, took_s
    await blockers_done.wait()  # the blockers end before the next test


async def test_nested_deadlines_each_raise_for_their_own_expiry_only() -> None:
    async with StallTolerantTimeout(1.0) as outer:
        with pytest.raises(TimeoutError):
            async with StallTolerantTimeout(0.05) as inner:
                await asyncio.sleep(5)
    assert inner.expired and not outer.expired

    with pytest.raises(TimeoutError):
        async with StallTolerantTimeout(0.05) as outer, StallTolerantTimeout(5.0) as inner:
            await asyncio.sleep(5)
    assert outer.expired and not inner.expired


async def test_a_cancellation_from_elsewhere_as_the_deadline_comes_stays_a_cancellation(
) -> None:
    """The deadline and a cancel from outside in the same loop pass: the caller asked
    to stop, which is not a timeout."""
    loop = asyncio.get_running_loop()

    async def call() -> None:
        async with StallTolerantTimeout(0.05):
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await asyncio.sleep(0)  # the deadline's timer is registered first
    loop.call_at(loop.time() + 0.05, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task


async def _call(deadlines: TaskDeadlines, delay_s: float, work_s: float,
                steps: int = 1) -> str:
    """A call under ``deadlines`` as the Kafka adapter makes one: ``steps`` waits of
    ``work_s``, each followed by progress (a restart)."""
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    deadlines.set(task, delay_s)
    try:
        for _ in range(steps):
            await asyncio.sleep(work_s)
            deadlines.restart(task, delay_s)
        return "done"
    except asyncio.CancelledError:
        if not deadlines.expired(task, cancelling):
            raise
        return "expired"
    finally:
        deadlines.clear(task)


async def test_task_deadlines_cancel_a_call_past_its_deadline_within_a_tick() -> None:
    deadlines = TaskDeadlines(0.05)
    started = time.monotonic()
    assert await _call(deadlines, 0.2, 5) == "expired"
    assert 0.19 < time.monotonic() - started < 0.6  # the deadline, then at most a tick
    assert await _call(deadlines, 0.2, 0.01) == "done"  # the task's next call is its own


async def test_task_deadlines_run_from_the_last_restart() -> None:
    """Progress moves the deadline: four steps of 0.1 s under a 0.2 s deadline end."""
    deadlines = TaskDeadlines(0.02)
    assert await _call(deadlines, 0.2, 0.1, steps=4) == "done"
    started = time.monotonic()
    assert await _call(deadlines, 0.2, 0.15, steps=2) == "done"
    assert await _call(deadlines, 0.2, 5) == "expired"
    assert time.monotonic() - started < 1.2


async def test_task_deadlines_leave_a_cancellation_from_elsewhere_a_cancellation() -> None:
    deadlines = TaskDeadlines(0.02)
    task = asyncio.create_task(_call(deadlines, 5, 5))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _call(deadlines, 0.05, 5) == "expired"  # no cancellation left over


async def test_task_deadlines_cancel_nothing_once_cleared_and_stop_ticking() -> None:
    deadlines = TaskDeadlines(0.02)
    assert await _call(deadlines, 0.05, 0.01) == "done"
    await asyncio.sleep(0.2)  # past the deadline: nothing is cancelled
    assert deadlines._handle is None, "a timer still ticks with nothing watched"
