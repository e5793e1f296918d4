"""The warning of an app that skips most of what it takes: once a window, and only then."""

from __future__ import annotations

import logging

import pytest

from conveyor.platform.delivery.chain import DeliveryStats
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message

TOLD = "it is reading other apps' traffic"


async def _no_letters(letter: DeadLetter) -> None:
    raise AssertionError("skip mode stores no dead letter")


def skip(orphans: Orphans, count: int, namespace: str = "theirs") -> None:
    msg = Message("id", StreamId(namespace, "k"), b"{}")
    for _ in range(count):
        assert orphans.take(msg) is None


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if TOLD in r.getMessage()]


def test_skips_that_are_a_minority_of_what_was_taken_are_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = DeliveryStats()
    orphans = Orphans(_no_letters, stats, "shop")
    with caplog.at_level(logging.WARNING, logger="conveyor.agent"):
        for _ in range(10):
            stats.handled += 100
            skip(orphans, 90)
    assert stats.skipped == 900 and told(caplog) == []


def test_mostly_skipping_is_reported_once_a_window_naming_namespaces_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = DeliveryStats()
    orphans = Orphans(_no_letters, stats, "x")
    with caplog.at_level(logging.WARNING, logger="conveyor.agent"):
        stats.handled += 5
        skip(orphans, 99, "orders")
        assert told(caplog) == []  # too few to judge
        skip(orphans, 1, "payments")
        skip(orphans, 25_000, "orders")
    lines = told(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith("app 'x' skipped 100 of the 105 messages")
    assert "(orders, payments)" in lines[0] and "[redis] prefix or [kafka] topic" in lines[0]


def test_the_warning_gives_the_window_to_a_tenth_of_a_second_as_the_docs_show_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/apps-on-one-broker.md shows `in the last 1.8 s`; whole seconds said `2 s`,
    and `0 s` for a burst skipped within the first half second."""
    clock = [100.0]
    monkeypatch.setattr("conveyor.platform.delivery.orphans.time.monotonic", lambda: clock[0])
    orphans = Orphans(_no_letters, DeliveryStats(), "x")
    clock[0] = 101.8
    with caplog.at_level(logging.WARNING, logger="conveyor.agent"):
        skip(orphans, 100, "orders")
    [line] = told(caplog)
    assert "messages it took in the last 1.8 s: " in line, line
