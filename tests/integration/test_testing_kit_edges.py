"""conveyor.testing used as a new user would, hostile or careless: handlers of every kind
documented, and mistakes that must fail in one line naming the problem (found by a walk
through the kit as a user)."""

from __future__ import annotations

import asyncio
import time

import pytest

import conveyor
from conveyor import App, Publish
from conveyor.testing import DeadLettersFound, Outcome, TestWorker


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# -- handlers the docs promise ------------------------------------------------------------
async def test_a_plain_def_batch_handler_runs_and_its_calls_are_noted() -> None:
    # docs/sync-handlers.md: "Batch handlers (batch_size=N): one thread call per batch".
    # The kit wrapped every batch handler in an `async def` recorder, so a plain `def`
    # one was dead-lettered with "... returned a coroutine: declare it `async def`".
    app = App("rows")
    stored: list[list[int]] = []

    @app.handler("rows", batch_size=10)
    def store(rows: list[int]) -> None:
        if -1 in rows:
            raise ValueError("a negative row")
        stored.append(list(rows))

    async with TestWorker(app) as worker:
        await worker.publish_batch([Publish("rows", "k", n) for n in (1, 2, -1, 3)])
        await worker.settle(raise_on_dead_letters=False)

    assert sorted(n for rows in stored for n in rows) == [1, 2, 3]
    [poison] = worker.dead_lettered("rows")
    assert poison.body == -1 and poison.letter is not None
    assert poison.letter.error == "a negative row"
    assert [r.body for r in worker.handled("rows")] == [1, 2, 3]
    calls = worker.batches(store)
    assert calls[0].bodies == (1, 2, -1, 3) and isinstance(calls[0].error, ValueError)
    assert calls[-1].error is None
    assert worker.daemon.threads.peak_running >= 1  # it ran on a handler thread


async def test_a_handler_raising_a_base_exception_has_each_attempt_recorded() -> None:
    # docs/writing-handlers.md: a CancelledError nothing sent, or a BaseException of the
    # user's own, fails the call like any exception (HandlerCancelled, HandlerBaseException).
    # The kit's recorder let BaseExceptions through unrecorded: the records had no
    # attempts, no error (settle's DeadLettersFound had no cause), and a call that failed
    # so and then succeeded was reported handled on its first and only attempt.
    class Abort(BaseException):
        pass

    app = App("base")
    calls = {"n": 0}

    @app.handler("cancelled", retry_attempts=2)
    async def cancelled(n: int) -> None:
        raise asyncio.CancelledError()

    @app.handler("aborted", retry_attempts=2)
    async def aborted(n: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Abort("not now")

    async with TestWorker(app) as worker:
        await worker.publish("cancelled", "k", 1)
        await worker.publish("aborted", "k", 1)
        with pytest.raises(DeadLettersFound) as found:
            await worker.settle()

    assert isinstance(found.value.__cause__, conveyor.ConveyorError)
    assert "CancelledError" in str(found.value.__cause__)
    [dead] = worker.dead_lettered("cancelled")
    assert [a.number for a in dead.attempts] == [1, 2]
    assert all("CancelledError" in str(a.error) for a in dead.attempts)
    assert isinstance(dead.error, conveyor.ConveyorError)
    [handled] = worker.handled("aborted")
    assert handled.retried
    assert [a.number for a in handled.attempts] == [1, 2]
    assert "Abort: not now" in str(handled.attempts[0].error)
    assert handled.attempts[1].error is None


async def test_settle_returns_when_a_handler_that_blocked_the_loop_past_its_deadline_is_done(
) -> None:
    # A blocking call in an async handler (a mistake Conveyor survives and names) made
    # the deadline pass while the loop was blocked; by the time it fired the message was
    # acknowledged, yet settle() raised NotSettled listing nothing.
    app = App("blocking")

    @app.handler("slow")
    async def slow(seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - the mistake under test

    async with TestWorker(app) as worker:
        await worker.publish("slow", "k", 0.4)
        settled = await worker.settle(timeout_s=0.1)
    assert [r.outcome for r in settled] == [Outcome.HANDLED]
