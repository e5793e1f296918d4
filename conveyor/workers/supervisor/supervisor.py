"""The supervisor's loop: run ``MIN..MAX`` daemon processes and scale them on lag.

Every inspection period it replaces dead children, hands out queues owned by nobody,
reads the lag of every queue from the broker (``QueueAdapter.lag(queue, group)``) and
does what :class:`~conveyor.workers.supervisor.scaler.LagScaler` decides: start a
process and give it its share of the queues, or drain an idle one's queues to the
others and stop it (:mod:`conveyor.workers.supervisor.assignment` moves them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.backends import backend, create_adapter
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, ConveyorError, error_text
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.supervisor.assignment import adopt_orphans, assign, rebalance
from conveyor.workers.supervisor.process import ChildGone, ChildProcess
from conveyor.workers.supervisor.scaler import (
    Decision,
    LagScaler,
    SupervisorSettings,
    choose_victim,
)

log = logging.getLogger("conveyor.supervisor")
STATUS_EVERY_S = 10.0


def _metric(unit: str, description: str, *, counter: bool) -> Any:
    return dataclasses.field(default=0, metadata={"metric": (unit, description, counter)})


@dataclass(slots=True)
class SupervisorStats:
    """What the supervisor saw and did, exported as ``conveyor.supervisor.<field>``."""

    lag: int = _metric("{message}", "Messages of the app's queues not yet finished",
                       counter=False)
    lag_per_process: float = _metric("{message}", "Lag divided by the process count",
                                     counter=False)
    scale_ups: int = _metric("{process}", "Processes added on lag", counter=True)
    scale_downs: int = _metric("{process}", "Idle processes removed", counter=True)
    replaced: int = _metric("{process}", "Processes that died and were replaced",
                            counter=True)
    silent_killed: int = _metric("{process}", "Processes killed for sending nothing for "
                                 "silent_child_s (stopped or hung)", counter=True)
    errors: int = _metric("{inspection}", "Inspections that failed and were retried",
                          counter=True)


class Supervisor:
    """Runs ``MIN..MAX`` daemon processes for one app and scales them on lag."""

    def __init__(
        self,
        app_path: str,
        app_name: str,
        config: Config,
        settings: SupervisorSettings,
        *,
        config_path: str | None = None,
        config_text: bytes | None = None,
        env: Mapping[str, str] | None = None,
        adapter: QueueAdapter | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        if backend(config.queues.adapter).in_process:
            raise ConfigError(
                "--processes needs a broker shared by processes (redis or kafka): the "
                f"{config.queues.adapter} adapter lives inside one process"
            )
        if config.kafka.group_instance_id and config.balancer.kind == "kafka-group":
            raise ConfigError(
                "$.kafka.group_instance_id: names one daemon, and --processes runs several "
                "under one config (the broker would fence all but one); leave it empty"
            )
        self.app_path = app_path
        self.group = app_name
        self.config = config
        self.settings = settings
        self.config_path = config_path or "-"
        self.config_text = config_text
        """The config file's bytes as the CLI read them, handed to each child (which then
        names the file only in errors); None: each child reads ``config_path`` itself. A
        file given as ``<(command)`` is a pipe the children can neither open nor read
        again, and a file edited since would start a child on another config."""
        self.env = dict(env or {})
        self._adapter = adapter
        self.scaler = LagScaler(settings)
        self.children: list[ChildProcess] = []
        self._serial = 0
        self.stats = SupervisorStats()
        self.drained: dict[str, int] = {}
        """The drain reports of every child stopped so far, added up."""
        self._was_busy = False
        self._status_at = 0.0
        self._started = False
        self._stop: asyncio.Event | None = None
        self._register_metrics(telemetry or Telemetry.disabled())

    def _register_metrics(self, t: Telemetry) -> None:
        t.observe("conveyor.supervisor.processes", "{process}", "Daemon processes running",
                  _unlabelled(lambda: self.processes))

        def stat(name: str) -> Callable[[], float]:
            return lambda: float(getattr(self.stats, name))

        for f in dataclasses.fields(SupervisorStats):
            unit, description, counter = f.metadata["metric"]
            t.observe(f"conveyor.supervisor.{f.name}", unit, description,
                      _unlabelled(stat(f.name)), counter=counter)

    @property
    def processes(self) -> int:
        return len(self.children)

    def readiness(self) -> str | None:
        """None once the first processes own the queues, while one lives and no stop
        was asked for; else why not (``/readyz``)."""
        if self._stop is not None and self._stop.is_set():
            return "draining"
        if not self._started:
            return "starting"
        if not any(c.alive for c in self.children):
            return "no daemon process alive"
        return None

    # -- running -----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event,
                  ready: Callable[[str], None] | None = None) -> None:
        """Until ``stop`` is set; ``ready`` gets the first processes' daemon ids once they
        own every queue."""
        adapter = self._adapter or create_adapter(self.config.queues.adapter, self.config)
        self._stop = stop
        try:
            for _ in range(self.settings.min_processes):
                await self._spawn()
            try:
                await assign(self.children, range(self.config.queues.total))
            except ChildGone as exc:
                # A child that died taking its first queues (a message that kills its
                # worker, at the head of a backlog) is what every inspection handles:
                # replaced, its queues adopted, now rather than a period later. A child
                # that reports it cannot take them (ChildCommandFailed: the broker is
                # unreachable) ends the start with the reason.
                log.warning("supervisor: %s while the queues were first assigned", exc)
                await self.tick(adapter)
            self._started = True
            log.info("supervisor: %d process(es) own %d queue(s)",
                     self.processes, self.config.queues.total)
            if ready is not None:
                ready(", ".join(c.member_id for c in self.children))
            watch = asyncio.create_task(self._kill_silent(), name="supervisor-silence")
            try:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):  # not wait_for: can lose a cancel
                        async with asyncio.timeout(self.settings.inspection_period_s):
                            await stop.wait()
                    if stop.is_set():
                        break
                    await self.tick(adapter)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        finally:
            await asyncio.gather(
                *(c.stop(self.settings.stop_timeout_s) for c in self.children),
                return_exceptions=True,
            )
            for child in self.children:
                self._count_drained(child)
                log.info("supervisor: process #%d stopped: %s", child.number, child.report)
            if self._adapter is None:
                await adapter.close()

    async def tick(self, adapter: QueueAdapter) -> None:
        """One inspection period. A failure is logged and retried next period, never fatal:
        the broker may be briefly unreachable, a child may die mid-move or fail to start.
        Ownership stays true to what the children confirmed, so the next tick replaces
        dead children and hands queues owned by nobody to the living ones."""
        try:
            try:
                await self._replace_dead()
            finally:  # a replacement that failed to start must not strand the queues
                await adopt_orphans(self.children, self.config.queues.total)
            if self.children:
                await self.inspect(adapter)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.errors += 1
            log.error("supervisor: inspection failed, retrying in %.1fs: %s",
                      self.settings.inspection_period_s, error_text(exc),
                      exc_info=not isinstance(exc, ConveyorError))

    async def inspect(self, adapter: QueueAdapter) -> Decision:
        total = self.config.queues.total
        lags = await asyncio.gather(*(adapter.lag(q, self.group) for q in range(total)))
        by_process = [sum(lags[q] for q in c.queues) for c in self.children]
        self.stats.lag = sum(lags)
        self.stats.lag_per_process = self.stats.lag / max(1, self.processes)
        now = time.monotonic()
        decision = self.scaler.decide(now, by_process, total)
        # Lag and process count at INFO when the app goes busy or idle, and every
        # STATUS_EVERY_S while busy; every inspection at DEBUG.
        busy = self.stats.lag > 0
        if busy != self._was_busy or (busy and now - self._status_at >= STATUS_EVERY_S):
            log.info("supervisor: lag=%d (%.0f/process) processes=%d",
                     self.stats.lag, self.stats.lag_per_process, self.processes)
            self._was_busy, self._status_at = busy, now
        log.debug("supervisor: lag=%d per_process=%.0f processes=%d decision=%s",
                  self.stats.lag, self.stats.lag_per_process, self.processes, decision.value)
        if decision is Decision.UP:
            await self._scale_up()
        elif decision is Decision.DOWN:
            await self._scale_down(by_process)
        return decision

    async def _spawn(self) -> ChildProcess:
        self._serial += 1
        child = ChildProcess(self._serial)
        try:
            await child.start(self.app_path, self.config_path, self.env, self.config_text)
        except BaseException:
            with contextlib.suppress(Exception):
                await child.stop(1.0)  # reap it if it started at all
            raise
        self.children.append(child)
        return child

    async def _scale_up(self) -> None:
        started = time.monotonic()
        await self._spawn()
        self.stats.scale_ups += 1
        moved = await rebalance(self.children, self.children, self.config.queues.total)
        log.info(
            "supervisor: scale up to %d process(es): lag %d (%.0f/process > %d); "
            "%d queue(s) moved in %.2fs",
            self.processes, self.stats.lag, self.stats.lag_per_process,
            self.settings.lag_per_process, moved, time.monotonic() - started,
        )

    async def _scale_down(self, lag_by_process: list[int]) -> None:
        if self.processes <= self.settings.min_processes:
            return
        index = choose_victim(
            lag_by_process, [c.number for c in self.children],
            self.settings.idle_lag_per_process,
        )
        if index is None:
            return
        victim = self.children[index]
        started = time.monotonic()
        queues = len(victim.queues)
        # The victim stays a child until every queue has moved: if a move fails, what
        # it still owns is still counted, and a queue released but not acquired
        # elsewhere is owned by nobody and adopted at the next tick.
        await rebalance(self.children, [c for c in self.children if c is not victim],
                        self.config.queues.total)
        self.children.remove(victim)
        await victim.stop(self.settings.stop_timeout_s)
        self._count_drained(victim)
        self.stats.scale_downs += 1
        log.info(
            "supervisor: scale down to %d process(es): lag %d; process #%d drained "
            "and released %d queue(s) in %.2fs (%s)",
            self.processes, self.stats.lag, victim.number, queues,
            time.monotonic() - started, victim.report,
        )

    def _count_drained(self, child: ChildProcess) -> None:
        for name, count in child.counts.items():
            self.drained[name] = self.drained.get(name, 0) + count

    async def _kill_silent(self) -> None:
        """Kill every child that has sent nothing for ``silent_child_s`` (stopped, or hung
        holding the interpreter: its beat thread is silent too). Its queues would
        otherwise wait for it for good, their leases lapsed and nobody taking them; dead,
        it is replaced and its queues adopted by the next :meth:`tick`. A task of its
        own, not a step of the tick: a tick can be waiting on that very child (a queue
        move), and the kill is what ends that wait. Silence is counted from when the
        supervisor itself last ran, so a pause of its own (beats unread in the pipe) is
        not blamed on the children."""
        limit_s = self.settings.silent_child_s
        period_s = min(self.settings.inspection_period_s, limit_s / 4)
        ran_at = time.monotonic()
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            if now - ran_at > max(2 * period_s, 1.0):  # this loop was held up: start over
                for child in self.children:
                    child.heard_at = max(child.heard_at, now)
            ran_at = now
            for child in [c for c in self.children if c.alive]:
                silent_s = now - child.heard_at
                if silent_s < limit_s:
                    continue
                pid = child.proc.pid if child.proc is not None else 0
                log.error("supervisor: process #%d (pid %d) has sent nothing for %.1fs "
                          "(stopped, or hung): killing it; its queues go to the others",
                          child.number, pid, silent_s)
                self.stats.silent_killed += 1
                await child.kill()

    async def _replace_dead(self) -> None:
        """Drop dead children and start new ones up to MIN (their queues are orphans now,
        adopted by :func:`~conveyor.workers.supervisor.assignment.adopt_orphans`)."""
        for child in [c for c in self.children if not c.alive]:
            self.children.remove(child)
            await child.stop(1.0)  # its exit status, to say how it died
            log.error("supervisor: process #%d died (%s); its queues go to the others",
                      child.number, child.ended or "?")
            self.stats.replaced += 1
        while self.processes < self.settings.min_processes:
            await self._spawn()


def _unlabelled(value: Callable[[], float]) -> Callable[[], list[tuple[float, dict[str, str]]]]:
    return lambda: [(value(), {})]
