"""Stopping tasks we started, without swallowing a cancellation meant for us."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has finished.

    Their own ``CancelledError`` is swallowed: we asked for it. A cancellation of the
    *caller* that arrives meanwhile is not: it is raised once every task has finished
    (a cancel of the caller while it waits is forwarded to the task being awaited, as any
    ``await task`` does, so the wait stays short). The caller counts as cancelled when
    its :meth:`asyncio.Task.cancelling` count rose during the wait — so a cancellation
    already on its way out (this called from a ``finally`` or an ``except
    CancelledError``) does not cut the rest of that clean-up short, and one taken back
    with :meth:`~asyncio.Task.uncancel` (``asyncio.timeout``) is not raised twice. The
    first exception a task ended with is raised after the wait (callers that do not care
    wrap the call in ``contextlib.suppress(Exception)``).

    A task already cancelled is not cancelled again, so a clean-up it runs on
    cancellation is interrupted once, not twice — unless that cancel was its own
    ``asyncio.timeout`` firing, which takes it back (``uncancel``) and carries on as if it
    had merely timed out: such a task is cancelled once it has run that far (one loop
    turn), or it would run on and this wait with it. (A kafka-group balancer's member
    report loop, a timeout a second, is such a task: a stop that came in the turn its
    timeout fired would wait for it for ever; a stopping worker was seen held for
    ``drain_timeout_s`` + 3 s, running the queues it had just been assigned.)
    """
    caller = asyncio.current_task()
    cancels_before = caller.cancelling() if caller is not None else 0
    await _cancel(tasks)
    failure: BaseException | None = None
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            pass  # the task's, or ours: told apart by the count below
        except Exception as exc:
            failure = failure or exc
    if caller is not None and caller.cancelling() > cancels_before:
        raise asyncio.CancelledError()
    if failure is not None:
        raise failure


async def cancel_and_wait_at_most(
    timeout_s: float, *tasks: asyncio.Task[Any]
) -> list[asyncio.Task[Any]]:
    """:func:`cancel_and_wait`, but waiting ``timeout_s`` at most: returns the tasks still
    running then (one that catches its cancellation and goes on), left to run. What the
    tasks end with is theirs to report (a done callback): nothing is raised for it, and
    it is read (:func:`retrieve`), now or when they end. A cancellation of the caller
    ends the wait and is raised, as there."""
    caller = asyncio.current_task()
    cancels_before = caller.cancelling() if caller is not None else 0
    await _cancel(tasks)
    for task in tasks:
        task.add_done_callback(retrieve)
    pending = {task for task in tasks if not task.done()}
    if pending:
        with contextlib.suppress(asyncio.CancelledError):  # ours: told apart below
            await asyncio.wait(pending, timeout=timeout_s)
    if caller is not None and caller.cancelling() > cancels_before:
        raise asyncio.CancelledError()
    return [task for task in tasks if not task.done()]


async def _cancel(tasks: tuple[asyncio.Task[Any], ...]) -> None:
    """Cancel those of ``tasks`` not done, once each (see :func:`cancel_and_wait`)."""
    taken_back: list[asyncio.Task[Any]] = []  # cancelled already: maybe by a timeout
    for task in tasks:
        if task.done():
            continue
        if task.cancelling():
            taken_back.append(task)
        else:
            task.cancel()
    if taken_back:
        # The cancel's wake-up is queued ahead of ours: after one turn a task still
        # counting it is cleaning up (left alone); one counting none took it back.
        with contextlib.suppress(asyncio.CancelledError):  # ours: raised once every
            await asyncio.sleep(0)  # task has finished (the count below says so)
        for task in taken_back:
            if not task.done() and not task.cancelling():
                task.cancel()


def raise_swallowed_cancel(task: asyncio.Task[Any] | None, stopping: bool) -> None:
    """Raise the ``CancelledError`` a cancel of ``task`` (the current task) asked for but
    that did not end it: a handler caught it (a bare ``except:``, ``except
    BaseException``) and returned. Called where a worker loop would otherwise wait for
    more work — there it would wait for ever, and :func:`cancel_and_wait` with it.
    (``asyncio.timeout`` takes its own cancel back: a handler that swallowed a
    timeout's owes none.)

    ``stopping``: the loop's owner has begun the stop whose cancel this would be. Only
    then is a count honoured; without a stop, nobody asked for a cancel and the count
    is taken back: Python 3.11's ``TaskGroup`` leaves one on its parent task when a
    child fails after the body has ended (CPython gh-116720), which a handler run in
    this task does — honoured, it ended a pool's or a cell's worker for good, and the
    calls given to it waited for ever."""
    if task is not None and task.cancelling():
        if stopping:
            raise asyncio.CancelledError
        while task.uncancel():
            pass


def retrieve(future: asyncio.Future[Any]) -> None:
    """A done callback for a task nobody awaits any more (a stop left behind, work
    cancelled and dropped): read its outcome, so that asyncio does not log an exception
    that was never retrieved."""
    if not future.cancelled():
        future.exception()
