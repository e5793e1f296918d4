"""Logging a broker outage at its edges, shared by the adapters that wait one out."""

from __future__ import annotations

import asyncio
import logging
import time

from conveyor.platform.watchdog import stall_note

OUTAGE_REPEAT = "conveyor_outage_repeat"
"""Set (True) on the log records that repeat an outage already reported ("still waiting
for ..."): a one-shot command drops them (``conveyor.cli``), so the first note and the
final error are all it prints."""


class OutageLog:
    """Whether a broker is reachable, logged once when an outage starts, every
    ``report_every_s`` while it lasts, and once when it ends — never per call.

    ``address`` is what the log names: it must carry no credentials (a redacted URL,
    or a ``HOST:PORT`` list). :attr:`reported` is set while an outage is known, so a
    start that waits for a first answer can stop waiting.
    """

    def __init__(self, log: logging.Logger, system: str, address: str,
                 report_every_s: float, retry_note: str = "") -> None:
        self._log = log
        self.system = system
        self.address = address
        self.report_every_s = report_every_s
        self._retry_note = retry_note
        self.down_since: float | None = None
        self.reported = asyncio.Event()
        self._last_report = 0.0

    def failing(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = self._last_report = now
            self.reported.set()
            self._log.warning("%s at %s unreachable while %s (%s)%s; retrying with back-off%s",
                              self.system, self.address, what, exc, stall_note(),
                              self._retry_note)
        elif now - self._last_report >= self.report_every_s:
            self._last_report = now
            self._log.warning("still waiting for %s at %s (down for %.0fs): %s",
                              self.system, self.address, now - self.down_since, exc,
                              extra={OUTAGE_REPEAT: True})

    def ok(self) -> None:
        if self.down_since is not None:
            self._log.warning("%s at %s reachable again after %.1fs", self.system,
                              self.address, time.monotonic() - self.down_since)
            self.down_since = None
            self.reported.clear()
