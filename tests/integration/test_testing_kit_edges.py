"""conveyor.testing used as a new user would, hostile or careless: handlers of every kind
documented, and mistakes that must fail in one line naming the problem (found by a walk
through the kit as a user)."""

from __future__ import annotations

from conveyor import App, Publish
from conveyor.testing import TestWorker


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
