"""One poll loop for every open page: what ``conveyor status`` reads, every ``interval_s``.

Pages never reach the broker for the overview, the daemons, the groups or the charts:
they read the last :class:`Reading` the loop took, so ten open tabs cost the broker what
one does. The loop rests while nobody looks (no page asked for ``idle_after_s``) and
wakes on the next request; the history behind the charts is kept from its readings only
(no Prometheus needed), ``window_s`` of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.backends import for_commands
from conveyor.console.probe import Refused, cluster_nodes, unless_refused
from conveyor.platform.adapter import StoreProblem
from conveyor.platform.config import Config
from conveyor.platform.errors import ConveyorError, error_text
from conveyor.platform.ids import is_app_name
from conveyor.platform.operations.status import (
    AppsReport,
    StatusReader,
    StatusReport,
    broker_warnings,
    lost_line,
    records_lost,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """One poll: every app found, and each watched app's status."""

    at: float
    apps: AppsReport | None = None
    status: dict[str, StatusReport] = field(default_factory=dict)
    error: str | None = None
    """Why the last poll failed (the broker down, say); the page shows it."""
    warnings: list[str] = field(default_factory=list)
    """What ``conveyor status`` warns of (:func:`broker_warnings`): a Redis that evicts or
    forgets on restart, entries past ``[queues] total``, a queue's or dead-letter store
    unfit for it."""


BEYOND_EVERY_S = 60.0
"""How often a poll also reads the queues past ``[queues] total`` (on Redis an ``XLEN``
of each up to 4,096, in one pipeline: more than the rest of a poll of a small app) and
checks the stores (:meth:`~conveyor.platform.adapter.QueueAdapter.store_problems`: on
Kafka an admin client and a DescribeConfigs per letter topic): the first poll, then once
a minute.
What they found is shown until the next look."""

POLL_TIMEOUT_S = 8.0
"""Longest one poll may take; one that takes longer (a broker that accepts connections
and does not answer) ends with an error reading and drops its connections. Below the
10 s a page's first request after a rest waits for a fresh reading, so that request gets
this poll's outcome rather than the reading before the rest."""
CLOSE_TIMEOUT_S = 5.0
"""Longest the console waits for its broker connections to close (at its exit)."""

LATENCY_KEYS = {"p50": "latency.p50_s", "p95": "latency.p95_s", "p99": "latency.p99_s"}
"""Chart series -> the heartbeat stat a daemon publishes (seconds, over the calls since
its previous heartbeat; absent without a meter or a call)."""


@dataclass(frozen=True)
class Sample:
    """What the charts keep of one reading of one app."""

    at: float
    counts: dict[str, tuple[float, int, int]]
    """Daemon id: (its heartbeat's time, handled, dead-lettered) as that heartbeat said."""
    lag: dict[int, int]
    latency: dict[str, float] = field(default_factory=dict)
    """Series (``p50``...) -> the slowest daemon's figure, in seconds; absent when no daemon
    published one."""
    appended: dict[int, int] = field(default_factory=dict)
    """Queue -> messages ever appended to it, where the broker tells."""


def chart_sample(report: StatusReport) -> Sample:
    counts = {}
    latency: dict[str, float] = {}
    for m in report.members:
        if "at" in m.stats:
            counts[m.id] = (m.stats["at"], int(m.stats.get("handled", 0)),
                            int(m.stats.get("dead_lettered", 0)))
        else:  # the record it joined with, before its first heartbeat: zero at its start
            counts[m.id] = (m.started_at, 0, 0)
        for name, key in LATENCY_KEYS.items():
            if key in m.stats:
                latency[name] = max(latency.get(name, 0.0), m.stats[key])
    appended = {q.queue: q.appended for q in report.queues if q.appended is not None}
    return Sample(report.at, counts, {q.queue: q.lag for q in report.queues}, latency,
                  appended)


def rates(samples: list[Sample]) -> list[dict[str, Any]]:
    """Per sample after the first: messages in per second (per queue and in all; None
    where the broker does not tell), handled/s and dead-lettered/s summed over the
    daemons, lag per queue, and the handler latency percentiles in milliseconds (None:
    unknown).

    Arrivals are read off the queues' end positions on the console's own clock, between
    two polls: exact, and independent of the daemons.

    A daemon's counts change only with its heartbeat (every ``lease_ttl_s / 3``), so each
    daemon's rate is taken between two of its heartbeats, on its own clock, and held
    until the next one: polls faster than heartbeats draw steps, not spikes and zeros.
    The first heartbeat the console sees of a daemon is its baseline — or its start, when
    the console saw it join (its record then has no counts: they were zero when it
    started), so a run shorter than two heartbeats still draws its rate. A daemon that
    left or restarted (counts going down) adds nothing until its next heartbeat.
    """
    out = []
    last: dict[str, tuple[float, int, int]] = {}
    per_daemon: dict[str, tuple[float, float]] = {}
    for i, sample in enumerate(samples):
        for member, (at, handled, dead) in sample.counts.items():
            before = last.get(member)
            if before is not None and 0 < before[0] < at:
                span = at - before[0]
                per_daemon[member] = (max(handled - before[1], 0) / span,
                                      max(dead - before[2], 0) / span)
            if before is None or at > before[0]:
                last[member] = (at, handled, dead)
        current = [per_daemon.get(m, (0.0, 0.0)) for m in sample.counts]
        if i == 0:
            continue
        arrivals = _arrivals(samples[i - 1], sample)
        out.append({"at": sample.at,
                    "in_per_s": sum(arrivals.values()) if arrivals else None,
                    "in_per_s_by_queue": {str(q): r for q, r in sorted(arrivals.items())},
                    "handled_per_s": sum(r[0] for r in current),
                    "dead_per_s": sum(r[1] for r in current),
                    "lag": {str(q): lag for q, lag in sorted(sample.lag.items())},
                    "latency_ms": {name: (sample.latency[name] * 1000
                                          if name in sample.latency else None)
                                   for name in LATENCY_KEYS}})
    return out


def _arrivals(before: Sample, after: Sample) -> dict[int, float]:
    """Messages in per second per queue between two samples; a queue whose end went
    back (re-created) or that either sample lacks is left out."""
    span = after.at - before.at
    if span <= 0:
        return {}
    return {q: (end - before.appended[q]) / span for q, end in after.appended.items()
            if q in before.appended and end >= before.appended[q]}


def _lost_lines(status: Mapping[str, StatusReport]) -> list[str]:
    """Records the broker deleted before they were handled, per app and daemon: what
    ``conveyor status --app`` shows under its daemons, here above every page."""
    return [f"app {name}: {lost_line(m.id, queue, count)}"
            for name, report in sorted(status.items()) for m in report.members
            for queue, count in records_lost(m.stats)]


class Poller:
    """Reads the broker every ``interval_s`` while someone looks; shared by all pages."""

    def __init__(self, config: Config, app: str | None, interval_s: float = 2.0,
                 window_s: float = 600.0, idle_after_s: float = 30.0,
                 timeout_s: float = POLL_TIMEOUT_S) -> None:
        self.config = config
        self.app = app
        self.interval_s = interval_s
        self.idle_after_s = idle_after_s
        self.timeout_s = timeout_s
        self.reading = Reading(at=0.0)
        self.polls = 0
        self._history: dict[str, deque[Sample]] = {}
        self._window = max(int(window_s / interval_s), 2)
        self._wanted = asyncio.Event()
        self._fresh = asyncio.Event()
        self._last_seen = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._beyond: dict[int, int] = {}
        self._problems: list[StoreProblem] = []
        self._looked_beyond = -BEYOND_EVERY_S
        self._reader: StatusReader | None = None
        """The connections the polls share (see :meth:`poll`); None until the first poll
        and after a failed one."""
        self._closing: set[asyncio.Task[None]] = set()
        self._nodes: list[str] = []
        """The cluster nodes the reader's client knew at the last good poll (probed with
        the URL's: :func:`~conveyor.console.probe.refused`); none after a failed one,
        whose next reader knows the URL's node alone."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="console-poller")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """End the loop: cancel it, and tell it to stop as well.

        The flag keeps the exit prompt when a cancel is lost inside a poll (Python
        3.11's ``asyncio.wait_for``, which redis-py calls on every command write with a
        socket timeout, returns the result instead of raising when the write completes
        as the cancel arrives): the loop would go on polling until this call gave up,
        holding the console's exit for ``timeout_s``; it ends after that poll instead. A
        poll stuck closing its broker connections is still left behind after
        ``timeout_s`` rather than holding the console's exit. The broker connections
        the polls kept are closed then, waiting at most :data:`CLOSE_TIMEOUT_S` more."""
        self._stopping = True
        self._wanted.set()  # a resting loop wakes to see the flag
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=timeout_s)
        self._drop_reader()
        if self._closing:
            await asyncio.wait(self._closing, timeout=CLOSE_TIMEOUT_S)

    async def current(self) -> Reading:
        """The last reading; the first request after a rest waits for a fresh one."""
        self._last_seen = time.monotonic()
        if not self._wanted.is_set():
            self._fresh.clear()
            self._wanted.set()
        if self.polls == 0 or not self._fresh.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fresh.wait(), timeout=10.0)
        return self.reading

    @property
    def resting(self) -> bool:
        """Whether the loop waits for a page to ask before it reads the broker again."""
        return not self._wanted.is_set()

    def history(self, app: str) -> list[Sample]:
        return list(self._history.get(app, ()))

    async def _run(self) -> None:
        while not self._stopping:
            if time.monotonic() - self._last_seen > self.idle_after_s:
                self._wanted.clear()
                await self._wanted.wait()
                if self._stopping:
                    return
            await self.poll()
            if not self._stopping:
                await asyncio.sleep(self.interval_s)

    async def poll(self) -> None:
        """One reading: the apps, then the status of each watched app, within
        ``timeout_s``.

        The polls share one :class:`StatusReader` — one adapter (on Kafka: its admin
        client and probe consumers), each app's membership and lease stores — opened by
        the first poll and kept, so that a poll does not connect, read the cluster's
        metadata and disconnect again for every app. A poll that fails (the broker down,
        or not answering within ``timeout_s``) drops it, closing it in the background:
        the next poll connects anew, so the console recovers when the broker does, and no
        poll waits on connections to a broker that does not answer."""
        try:
            async with asyncio.timeout(self.timeout_s):
                apps, status = await self._read_unless_refused()
        except TimeoutError:
            self._drop_reader()
            self._failed(f"BrokerConnectionError: no answer from the broker within "
                         f"{self.timeout_s:g}s")
        except Refused as exc:
            self._drop_reader()
            self._failed(f"BrokerConnectionError: {exc}")
        except ConveyorError as exc:
            self._drop_reader()
            self._failed(error_text(exc))
        except Exception as exc:  # the loop must outlive a broker's bad moment
            self._drop_reader()
            log.exception("console poll failed")
            self._failed(f"{type(exc).__name__} (see the console's log)")
        else:
            if self._reader is not None:
                self._nodes = cluster_nodes(self._reader.adapter)
            self.reading = Reading(time.time(), apps, status, warnings=[*broker_warnings(
                self.config, apps.eviction_policy, apps.persistence, self._beyond,
                self._problems), *_lost_lines(status)])
            for name, report in status.items():
                self._history.setdefault(name, deque(maxlen=self._window)).append(
                    chart_sample(report))
        self.polls += 1
        self._fresh.set()

    async def _read_unless_refused(self) -> tuple[AppsReport, dict[str, StatusReport]]:
        """:meth:`_read`, cut short once the Redis it reads refuses connections
        (:func:`~conveyor.console.probe.unless_refused`, with the cluster nodes the last
        good poll's client knew)."""
        return await unless_refused(self.config, self._read(), self._nodes)

    async def _read(self) -> tuple[AppsReport, dict[str, StatusReport]]:
        if self._reader is None:
            self._reader = StatusReader(self.config, for_commands(self.config))
        reader = self._reader
        look = time.monotonic() - self._looked_beyond >= BEYOND_EVERY_S
        apps = await reader.apps(look_beyond=look, look_stores=look)
        if look:
            self._beyond, self._looked_beyond = apps.beyond_total, time.monotonic()
            self._problems = apps.store_problems
        names = [self.app] if self.app else [a.app for a in apps.apps if is_app_name(a.app)]
        await reader.forget({*names, *(a.app for a in apps.apps)})
        status = {name: await reader.status(name, look_beyond=False, look_stores=False)
                  for name in names}
        return apps, status

    def _failed(self, error: str) -> None:
        self.reading = Reading(time.time(), self.reading.apps, self.reading.status, error,
                               self.reading.warnings)

    def _drop_reader(self) -> None:
        """Close the shared connections in the background (a broker that does not answer
        must not hold the next poll, or the console's exit, on them)."""
        reader, self._reader = self._reader, None
        self._nodes = []
        if reader is not None:
            task = asyncio.create_task(self._close(reader), name="console-poller-close")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(reader: StatusReader) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await reader.close()
        except Exception:  # closing what failed may fail too: nothing is lost
            log.debug("closing the console's broker connections failed", exc_info=True)
