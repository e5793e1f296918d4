"""Stopping a task we started (conveyor.platform.tasks.cancel_and_wait): its cancellation
is swallowed, the caller's own never is."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable

import pytest

from conveyor.platform.tasks import cancel_and_wait, cancel_and_wait_at_most

DEADLINE_S = 5.0


async def slow_to_finish(cleaning: asyncio.Event) -> None:
    """Runs until cancelled, then cleans up until cancelled again (which is what a caller
    cancelled while it awaits this does: the cancel is forwarded to what it awaits)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cleaning.set()
        await asyncio.Event().wait()
        raise


async def ignores_the_first_cancel(cleaning: asyncio.Event) -> str:
    """Takes its cancellation as a request to finish up, and returns normally."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cleaning.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
    return "finished"


async def old_pattern(task: asyncio.Task[object]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


Stopper = Callable[[asyncio.Task[object]], Awaitable[None]]


async def stop_a_child_while_cancelled(
    stopper: Stopper, child_body: Callable[[asyncio.Event], Awaitable[object]]
) -> tuple[asyncio.Task[None], list[str], asyncio.Task[object]]:
    """A caller stops a child with ``stopper``; it is cancelled while the child cleans up."""
    cleaning = asyncio.Event()
    child: asyncio.Task[object] = asyncio.create_task(child_body(cleaning))
    carried_on: list[str] = []
    ran_on = asyncio.Event()

    async def caller() -> None:
        await stopper(child)
        carried_on.append("after the stop")
        ran_on.set()
        await asyncio.Event().wait()  # a caller that then would run on, as a loop does

    calling = asyncio.create_task(caller())
    running_on = asyncio.create_task(ran_on.wait())
    async with asyncio.timeout(DEADLINE_S):
        await cleaning.wait()
        calling.cancel()
        await asyncio.wait({calling, running_on}, return_when=asyncio.FIRST_COMPLETED)
    running_on.cancel()
    if not calling.done():  # the old pattern: still running, cancel it for good
        calling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await calling
    return calling, carried_on, child


async def test_a_caller_cancelled_while_its_child_finishes_ends_cancelled() -> None:
    calling, carried_on, child = await stop_a_child_while_cancelled(
        cancel_and_wait, slow_to_finish)
    assert calling.cancelled() and carried_on == []
    assert child.cancelled()


async def test_a_caller_cancelled_while_its_child_returns_normally_ends_cancelled() -> None:
    calling, carried_on, child = await stop_a_child_while_cancelled(
        cancel_and_wait, ignores_the_first_cancel)
    assert calling.cancelled() and carried_on == []
    assert child.result() == "finished"


@pytest.mark.parametrize("child_body", [slow_to_finish, ignores_the_first_cancel])
async def test_the_old_pattern_swallows_the_callers_cancellation(
    child_body: Callable[[asyncio.Event], Awaitable[object]]
) -> None:
    """Why the helper exists: cancel + suppress(CancelledError) + await carries on."""
    _, carried_on, _ = await stop_a_child_while_cancelled(old_pattern, child_body)
    assert carried_on == ["after the stop"]


async def test_the_childs_own_cancellation_is_swallowed() -> None:
    children = [asyncio.create_task(asyncio.Event().wait()) for _ in range(2)]
    async with asyncio.timeout(DEADLINE_S):
        await cancel_and_wait(*children)
    assert all(child.cancelled() for child in children)


async def test_a_task_already_cancelled_is_not_cancelled_again() -> None:
    cleaning = asyncio.Event()
    finish = asyncio.Event()

    async def cleans_up_until_told() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaning.set()
            await finish.wait()  # a second cancel would interrupt this
        return "cleaned up"

    child = asyncio.create_task(cleans_up_until_told())
    await asyncio.sleep(0)  # one loop turn: the child runs up to its wait
    child.cancel()
    async with asyncio.timeout(DEADLINE_S):
        await cleaning.wait()
        stopping = asyncio.create_task(cancel_and_wait(child))
        await asyncio.sleep(0)  # one loop turn: the helper runs up to its wait
        finish.set()
        await stopping
    assert child.result() == "cleaned up"


async def test_in_a_clean_up_after_the_callers_cancel_the_rest_still_runs() -> None:
    """A cancellation already on its way out is not raised again by the helper."""
    closed: list[str] = []
    started = asyncio.Event()

    async def caller() -> None:
        child = asyncio.create_task(asyncio.Event().wait())
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(child)
            closed.append("closed")

    calling = asyncio.create_task(caller())
    async with asyncio.timeout(DEADLINE_S):
        await started.wait()
        calling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await calling
    assert calling.cancelled() and closed == ["closed"]


async def test_a_childs_failure_is_raised_once_every_task_has_finished() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("clean-up failed") from None

    failing = asyncio.create_task(fails_on_cancel())
    other = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)  # one loop turn: both run up to their waits
    async with asyncio.timeout(DEADLINE_S):
        with pytest.raises(RuntimeError, match="clean-up failed"):
            await cancel_and_wait(failing, other)
    assert other.cancelled()


async def test_a_timeout_around_it_becomes_a_timeout_error_and_is_then_forgotten() -> None:
    cleaning = asyncio.Event()
    child = asyncio.create_task(slow_to_finish(cleaning))
    await asyncio.sleep(0)  # one loop turn: the child runs up to its wait
    child.cancel()
    async with asyncio.timeout(DEADLINE_S):
        await cleaning.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):  # fires while the child still cleans up
            await cancel_and_wait(child)
    assert child.cancelled()
    later = asyncio.create_task(asyncio.Event().wait())
    await cancel_and_wait(later)  # the timeout's cancel was taken back: nothing raised
    assert later.cancelled()


async def test_a_task_whose_own_timeout_fired_in_the_same_turn_is_still_stopped() -> None:
    """The task counts a cancel when the helper looks (its ``asyncio.timeout`` fired in
    this loop turn), which the timeout then takes back: it is cancelled after all. (A
    daemon's member report loop, a timeout per turn, kept its stop waiting for ever.)"""
    loop = asyncio.get_running_loop()
    turns: list[float] = []

    async def reports_each_turn(first_deadline: float) -> None:
        deadline = first_deadline
        while True:
            turns.append(loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await asyncio.Event().wait()
            deadline = loop.time() + 3600

    at = loop.time() + 0.05
    woken = loop.create_future()
    loop.call_at(at, woken.set_result, None)  # the stop's turn, due first at that instant
    child = asyncio.create_task(reports_each_turn(at))
    await woken
    assert child.cancelling() == 1, "the child's timeout fired in this very turn"
    async with asyncio.timeout(DEADLINE_S):
        await cancel_and_wait(child)
    assert child.cancelled()
    assert len(turns) == 2, "the timeout took its cancel back: the child went round again"



async def swallows_its_cancels(until: asyncio.Event) -> None:
    """A poller that catches its cancellation and goes on (a stop's startup hook), until
    ``until`` is set."""
    while not until.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)


async def test_a_bounded_wait_returns_the_task_that_swallows_its_cancel_and_leaves_it() -> None:
    until = asyncio.Event()
    ends = asyncio.create_task(asyncio.Event().wait())
    runs_on = asyncio.create_task(swallows_its_cancels(until))
    await asyncio.sleep(0)
    left = await asyncio.wait_for(cancel_and_wait_at_most(0.1, ends, runs_on), DEADLINE_S)
    assert left == [runs_on] and ends.cancelled() and not runs_on.done()
    until.set()
    async with asyncio.timeout(DEADLINE_S):
        await runs_on


async def fails_when_cancelled() -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise ValueError("failed on its way out") from None


def test_a_bounded_wait_reads_what_its_tasks_failed_with_as_the_unbounded_one_did() -> None:
    # cancel_and_wait awaits its tasks (the daemon's stop let their failures be);
    # the bounded one must not leave a failure for asyncio to log as never retrieved
    # (a server check's task has no done callback of its own).
    unretrieved: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unretrieved.append(context["message"]))
        failing = asyncio.create_task(fails_when_cancelled())
        await asyncio.sleep(0)
        assert await cancel_and_wait_at_most(1.0, failing) == []
        assert failing.done()
        del failing
        gc.collect()

    asyncio.run(main())
    gc.collect()
    assert unretrieved == []
