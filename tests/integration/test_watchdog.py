"""The loop watchdog on the embedded adapter: a handler that blocks its event loop is
named (handler, message, stack) and counted; one that does not is not."""

from __future__ import annotations

import logging
import time

import pytest

from conveyor import App
from conveyor.platform.config import Config, WorkerConfig
from conveyor.testing import TestWorker


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
    lines = [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(lines) == 1, lines  # the second stall of the same handler is counted, not logged
    [line] = lines
    assert "handler tests.integration.test_watchdog.on_job" in line or "on_job" in line
    assert blocker.id in line or second.id in line
    assert "time.sleep" in line and "test_watchdog.py" in line
