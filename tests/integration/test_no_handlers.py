"""An app that declares no handlers: its warning says what happens to every message, and
that is what happens (skipped by default, dead-lettered when configured so)."""

from __future__ import annotations

import logging

import pytest

from conveyor import App, Client
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter, publish_items


@pytest.mark.parametrize(("unroutable", "says", "counter"), [
    ("skip", "every message will be skipped (acknowledged unhandled)", "skipped"),
    ("dead-letter", "every message will be dead-lettered", "dead_lettered"),
])
async def test_the_no_handlers_warning_says_what_then_happens(
    caplog: pytest.LogCaptureFixture, unroutable: str, says: str, counter: str
) -> None:
    adapter = fresh_adapter()
    d = daemon(App("empty"), adapter, config(dead_letters={"unroutable": unroutable}))
    await publish_items(Client(adapter, d.mapper), 30, streams=3)
    with caplog.at_level(logging.WARNING, logger="conveyor.daemon"):
        await d.start()
    try:
        await wait_until(lambda: d.stats_snapshot()[counter] == 30, 10,
                         what=f"30 messages {counter}")
    finally:
        await d.stop()
    [warning] = [r.getMessage() for r in caplog.records if "declares no handlers" in r.message]
    assert says in warning and f"unroutable = '{unroutable}'" in warning, warning
    other = "dead_lettered" if counter == "skipped" else "skipped"
    assert d.stats_snapshot()[other] == 0
