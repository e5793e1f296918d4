"""Logging a broker outage at its edges, shared by the adapters that wait one out."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref

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

    @classmethod
    def of_server(cls, log: logging.Logger, system: str, address: str,
                  report_every_s: float, retry_note: str = "") -> OutageLog:
        """The log of ``system`` at ``address`` that every caller of it in this process
        shares (the first of them to ask builds it).

        A worker reaches one server through several callers, each with its own
        connections: the adapter's, the balancer's membership and leases, idempotency
        claims. An outage is the server's: it is logged once, by whichever caller meets
        it first, and ended by the first call that gets through, whichever caller makes
        it. Logs of their own would say "unreachable" once per caller, and a caller that
        met the outage but made no call after it (a stopped worker's balancer) would
        leave it unended in the log.
        """
        key = (system, address)
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = cls(log, system, address, report_every_s, retry_note)
        return shared

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


_SHARED: weakref.WeakValueDictionary[tuple[str, str], OutageLog] = weakref.WeakValueDictionary()
"""The logs of :meth:`OutageLog.of_server`, each kept while a caller holds it."""
