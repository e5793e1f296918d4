"""Stopping tasks we started, without swallowing a cancellation meant for us."""

from __future__ import annotations

import asyncio
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
    cancellation is interrupted once, not twice.
    """
    caller = asyncio.current_task()
    cancels_before = caller.cancelling() if caller is not None else 0
    for task in tasks:
        if not task.done() and not task.cancelling():
            task.cancel()
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
