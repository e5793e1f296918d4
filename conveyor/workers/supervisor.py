"""Process autoscaling on lag: ``conveyor worker APP --processes MIN:MAX``.

The supervisor starts ``MIN`` daemon processes (:mod:`conveyor.workers.supervisor_child`),
hands each its share of the app's queues, and every inspection period reads the
consumer lag of every queue from the broker (``QueueAdapter.lag(queue, group)``):

* **up** — when lag per process has stayed above ``lag_per_process`` for
  ``scale_up_cycles`` inspections, it starts one more process (never more than
  ``MAX``, never more processes than queues) and moves its share of the queues to it,
  taken from the processes above theirs;
* **down** — the lag, in units of the threshold, is fed to the same PID
  :class:`~conveyor.workers.scaledown.ScaleDownController` that shrinks worker pools;
  a process counts as *idle* when its queues' lag is at most ``idle_lag_per_process``.
  When the controller says so, one idle process (never below ``MIN``) is removed
  gracefully: its queues are released one by one — each drained, its in-flight
  messages finished and acknowledged — and handed to the remaining processes short of
  their share, then it exits.

Either way the split stays even and only the surplus moves: the dynamic balancer's
sticky rule (:func:`plan_moves`, :func:`~conveyor.platform.balancer.sticky_split`).

A queue is moved by releasing it on its owner and only then acquiring it elsewhere,
so no queue is ever pulled by two processes: nothing is duplicated by a scale change,
and nothing is lost (unacknowledged messages of a crashed child are redelivered to
the queue's next owner, as with any receiver).

Lag must be shared across processes, so this needs a broker adapter (redis, kafka);
the in-process memory adapter is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conveyor.platform.adapter import QueueAdapter, create_adapter
from conveyor.platform.balancer import sticky_split
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, ConveyorError, InvalidArgumentError
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.scaledown import ScaleDownController, ScaleDownPolicy

if TYPE_CHECKING:
    from conveyor.workers.daemon import DrainReport

log = logging.getLogger("conveyor.supervisor")
STATUS_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    min_processes: int
    max_processes: int
    lag_per_process: int = 1000
    idle_lag_per_process: int = 50
    inspection_period_s: float = 0.5
    scale_up_cycles: int = 2
    scale_up_backoff_s: float = 2.0
    scale_down: ScaleDownPolicy = field(default_factory=ScaleDownPolicy)
    stop_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_processes <= self.max_processes:
            raise InvalidArgumentError(
                f"--processes needs 1 <= MIN <= MAX, got {self.min_processes}:{self.max_processes}"
            )

    @classmethod
    def from_config(
        cls, config: Config, min_processes: int, max_processes: int
    ) -> SupervisorSettings:
        s = config.supervisor
        period_s = s.inspection_period_ms / 1000
        return cls(
            min_processes=min_processes,
            max_processes=max_processes,
            lag_per_process=s.lag_per_process,
            idle_lag_per_process=(
                s.idle_lag_per_process if s.idle_lag_per_process is not None
                else s.lag_per_process // 20
            ),
            inspection_period_s=period_s,
            scale_up_cycles=s.scale_up_cycles,
            scale_up_backoff_s=s.scale_up_backoff_s,
            scale_down=ScaleDownPolicy(
                inspection_period_s=period_s,
                dead_zone_cycles=s.scale_down_dead_zone_cycles,
                backoff_s=s.scale_down_backoff_s,
            ),
            stop_timeout_s=config.worker.drain_timeout_s + 30,
        )


class Decision(enum.Enum):
    HOLD = "hold"
    UP = "up"
    DOWN = "down"


class LagScaler:
    """The supervisor's decision, pure and on an explicit clock (unit-testable)."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.controller = ScaleDownController(settings.scale_down)
        self._above = 0
        self._last_up: float | None = None

    def decide(self, now_s: float, lag_by_process: list[int], total_queues: int) -> Decision:
        s = self.settings
        n = len(lag_by_process)
        per_process = sum(lag_by_process) / n
        idle = sum(1 for lag in lag_by_process if lag <= s.idle_lag_per_process)
        # Waiting count in units of the threshold keeps the pool gains' scale. What the
        # controller is told it may remove is every process above MIN (when one of them
        # is idle), not the idle count: its anti-windup keeps (m-1)/m of the integral
        # after a removal, and over idle processes that is 0 whenever the first removal
        # finds a single idle one while the others still drain — the integral is zeroed,
        # no lag is left to rebuild it, and the supervisor stays above MIN for good.
        # Spread over the processes above MIN, a burst's integral lasts until MIN.
        removable = max(0, n - s.min_processes) if idle else 0
        remove = self.controller.inspect(now_s, per_process / s.lag_per_process, removable)
        self._above = self._above + 1 if per_process > s.lag_per_process else 0
        ceiling = min(s.max_processes, total_queues)
        if self._above >= s.scale_up_cycles and n < ceiling and (
            self._last_up is None or now_s - self._last_up >= s.scale_up_backoff_s
        ):
            self._above = 0
            self._last_up = now_s
            return Decision.UP
        return Decision.DOWN if remove else Decision.HOLD


class ChildGone(ConveyorError):
    """A child process exited while the supervisor was waiting for it."""


class ChildCommandFailed(ConveyorError):
    """A child could not acquire or release a queue (it reported the error)."""


class ChildProcess:
    """One supervised daemon process and its control channel."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.queues: set[int] = set()
        self.proc: asyncio.subprocess.Process | None = None
        self._waiters: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self.alive = False
        self._exited = False  # its event channel closed: nothing more will come
        self.report = ""
        self.counts: dict[str, int] = {}
        """The fields of its drain report, once it stopped and sent one."""
        self.member_id = ""
        self.http_port: int | None = None
        """The loopback port of its /metrics and probes, when [http] port is set."""

    async def start(self, app_path: str, config_path: str, env: Mapping[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "conveyor.workers.supervisor_child",
                app_path, config_path, str(write_fd),
                stdin=asyncio.subprocess.PIPE, pass_fds=(write_fd,),
                env={**os.environ, **env}, start_new_session=True,
            )
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        ready = self._expect("ready", -1)
        self._reader_task = asyncio.create_task(self._read(reader))
        try:
            event = await ready
        except ChildGone:
            raise ChildGone(
                f"process #{self.number} exited before it was ready (its error is logged "
                "above with its pid)"
            ) from None
        self.http_port = event.get("http_port")
        self.member_id = str(event.get("id", ""))
        self.alive = True

    def _expect(self, event: str, queue: int) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self._exited:  # asking a dead child would wait forever
            fut.set_exception(ChildGone(f"process #{self.number} exited"))
        else:
            self._waiters[(event, queue)] = fut
        return fut

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            event = json.loads(line)
            queue = int(event.get("queue", -1))
            if event["event"] == "failed":  # {"op": "acquire"|"release", "error": ...}
                fut = self._waiters.pop((f"{event['op']}d", queue), None)
                if fut is not None and not fut.done():
                    fut.set_exception(ChildCommandFailed(
                        f"process #{self.number} could not {event['op']} queue {queue}: "
                        f"{event.get('error', '')}"
                    ))
                continue
            fut = self._waiters.pop((event["event"], queue), None)
            if fut is not None and not fut.done():
                fut.set_result(event)
        self.alive = False  # the child closed its end: it has exited (or crashed)
        self._exited = True
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ChildGone(f"process #{self.number} exited"))
        self._waiters.clear()

    def _send(self, command: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())

    async def acquire(self, queue: int) -> None:
        done = self._expect("acquired", queue)
        self._send({"op": "acquire", "queue": queue})
        await done
        self.queues.add(queue)

    async def release(self, queue: int) -> None:
        """Returns once the child has drained the queue and shut its receiver down."""
        done = self._expect("released", queue)
        self._send({"op": "release", "queue": queue})
        try:
            await done
        except ChildCommandFailed:
            self.queues.discard(queue)  # the child dropped it; it is adopted next tick
            raise
        self.queues.discard(queue)

    async def stop(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        if self.alive:
            stopped = self._expect("stopped", -1)
            with contextlib.suppress(Exception):
                self._send({"op": "stop"})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            with contextlib.suppress(TimeoutError, ChildGone):
                event = await asyncio.wait_for(stopped, timeout_s)
                self.report = event.get("report", "")
                self.counts = {k: int(v) for k, v in event.get("counts", {}).items()}
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            log.error("process #%d did not exit in %.0fs; killing it", self.number, timeout_s)
            self.proc.kill()
            await self.proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(Exception):
                await self._reader_task
        self.alive = False


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
        env: Mapping[str, str] | None = None,
        adapter: QueueAdapter | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        if config.queues.adapter == "memory":
            raise ConfigError(
                "--processes needs a broker shared by processes (redis or kafka): the "
                "memory adapter lives inside one process"
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
        self.env = dict(env or {})
        self._adapter = adapter
        self.scaler = LagScaler(settings)
        self.children: list[ChildProcess] = []
        self._serial = 0
        self.lag = 0
        self.lag_per_process = 0.0
        self.scale_ups = 0
        self.scale_downs = 0
        self.replaced = 0
        self.errors = 0
        self.drained: dict[str, int] = {}
        """The drain reports of every child stopped so far, added up."""
        self._was_busy = False
        self._status_at = 0.0
        self._started = False
        self._stop: asyncio.Event | None = None
        self._register_metrics(telemetry or Telemetry.disabled())

    def _register_metrics(self, t: Telemetry) -> None:
        gauges = {
            "processes": ("{process}", "Daemon processes running", lambda: self.processes),
            "lag": ("{message}", "Messages of the app's queues not yet finished",
                    lambda: self.lag),
            "lag_per_process": ("{message}", "Lag divided by the process count",
                                lambda: self.lag_per_process),
        }
        counters = {
            "scale_ups": ("{process}", "Processes added on lag", lambda: self.scale_ups),
            "scale_downs": ("{process}", "Idle processes removed", lambda: self.scale_downs),
            "replaced": ("{process}", "Processes that died and were replaced",
                         lambda: self.replaced),
            "errors": ("{inspection}", "Inspections that failed and were retried",
                       lambda: self.errors),
        }
        for counter, table in ((False, gauges), (True, counters)):
            for name, (unit, description, value) in table.items():
                t.observe(f"conveyor.supervisor.{name}", unit, description,
                          _unlabelled(value), counter=counter)

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
            await self._assign(list(range(self.config.queues.total)))
            self._started = True
            log.info("supervisor: %d process(es) own %d queue(s)",
                     self.processes, self.config.queues.total)
            if ready is not None:
                ready(", ".join(c.member_id for c in self.children))
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):  # not wait_for: it can lose a cancel
                    async with asyncio.timeout(self.settings.inspection_period_s):
                        await stop.wait()
                if stop.is_set():
                    break
                await self.tick(adapter)
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
                await self._adopt_orphans()
            if self.children:
                await self.inspect(adapter)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors += 1
            log.error("supervisor: inspection failed, retrying in %.1fs: %s: %s",
                      self.settings.inspection_period_s, type(exc).__name__, exc,
                      exc_info=not isinstance(exc, ConveyorError))

    async def inspect(self, adapter: QueueAdapter) -> Decision:
        total = self.config.queues.total
        lags = await asyncio.gather(*(adapter.lag(q, self.group) for q in range(total)))
        by_process = [sum(lags[q] for q in c.queues) for c in self.children]
        self.lag = sum(lags)
        self.lag_per_process = self.lag / max(1, self.processes)
        now = time.monotonic()
        decision = self.scaler.decide(now, by_process, total)
        # Lag and process count at INFO when the app goes busy or idle, and every
        # STATUS_EVERY_S while busy; every inspection at DEBUG.
        busy = self.lag > 0
        if busy != self._was_busy or (busy and now - self._status_at >= STATUS_EVERY_S):
            log.info("supervisor: lag=%d (%.0f/process) processes=%d",
                     self.lag, self.lag_per_process, self.processes)
            self._was_busy, self._status_at = busy, now
        log.debug("supervisor: lag=%d per_process=%.0f processes=%d decision=%s",
                  self.lag, self.lag_per_process, self.processes, decision.value)
        if decision is Decision.UP:
            await self._scale_up()
        elif decision is Decision.DOWN:
            await self._scale_down(by_process)
        return decision

    async def _spawn(self) -> ChildProcess:
        self._serial += 1
        child = ChildProcess(self._serial)
        try:
            await child.start(self.app_path, self.config_path, self.env)
        except BaseException:
            with contextlib.suppress(Exception):
                await child.stop(1.0)  # reap it if it started at all
            raise
        self.children.append(child)
        return child

    async def _assign(self, queues: list[int]) -> None:
        """Give ``queues`` (owned by nobody) to the living children with the fewest queues.

        A child's ``queues`` only ever holds what it confirmed; a queue whose acquire
        failed stays owned by nobody and is adopted at the next tick."""
        alive = [c for c in self.children if c.alive]
        if not alive:
            return
        counts = {id(c): len(c.queues) for c in alive}
        plan = []
        for queue in queues:
            target = min(alive, key=lambda c: counts[id(c)])
            counts[id(target)] += 1
            plan.append(target.acquire(queue))
        await _all(plan)

    async def _adopt_orphans(self) -> None:
        owned = {q for c in self.children for q in c.queues}
        orphans = [q for q in range(self.config.queues.total) if q not in owned]
        if orphans and any(c.alive for c in self.children):
            log.warning("supervisor: queue(s) %s owned by nobody; assigning them", orphans)
            await self._assign(orphans)

    async def _move(self, queue: int, src: ChildProcess, dst: ChildProcess) -> None:
        await src.release(queue)  # drained and acknowledged before anyone else pulls it
        await dst.acquire(queue)

    async def _rebalance(self, keep: list[ChildProcess]) -> int:
        """Split the queues evenly over ``keep``, moving as few as possible
        (:func:`plan_moves`): those of a child not kept, and the surplus of those above
        their share. Returns how many moved (or were to: a failed move leaves its queue
        owned by whoever confirmed it, and the next tick adopts an orphan)."""
        by_number = {c.number: c for c in self.children}
        owners = {q: c.number for c in self.children for q in c.queues}
        plan = plan_moves(owners, [c.number for c in keep], self.config.queues.total)
        await _all(
            by_number[dst].acquire(q) if src is None
            else self._move(q, by_number[src], by_number[dst])
            for q, (src, dst) in sorted(plan.items())
        )
        return len(plan)

    async def _scale_up(self) -> None:
        started = time.monotonic()
        await self._spawn()
        self.scale_ups += 1
        moved = await self._rebalance(self.children)
        log.info(
            "supervisor: scale up to %d process(es): lag %d (%.0f/process > %d); "
            "%d queue(s) moved in %.2fs",
            self.processes, self.lag, self.lag_per_process, self.settings.lag_per_process,
            moved, time.monotonic() - started,
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
        await self._rebalance([c for c in self.children if c is not victim])
        self.children.remove(victim)
        await victim.stop(self.settings.stop_timeout_s)
        self._count_drained(victim)
        self.scale_downs += 1
        log.info(
            "supervisor: scale down to %d process(es): lag %d; process #%d drained "
            "and released %d queue(s) in %.2fs (%s)",
            self.processes, self.lag, victim.number, queues,
            time.monotonic() - started, victim.report,
        )

    def _count_drained(self, child: ChildProcess) -> None:
        for name, count in child.counts.items():
            self.drained[name] = self.drained.get(name, 0) + count

    async def _replace_dead(self) -> None:
        """Drop dead children and start new ones up to MIN (their queues are orphans now,
        adopted by :meth:`_adopt_orphans`)."""
        for child in [c for c in self.children if not c.alive]:
            log.error("supervisor: process #%d died; its queues go to the others", child.number)
            self.children.remove(child)
            await child.stop(1.0)
            self.replaced += 1
        while self.processes < self.settings.min_processes:
            await self._spawn()


def _unlabelled(value: Callable[[], float]) -> Callable[[], list[tuple[float, dict[str, str]]]]:
    return lambda: [(value(), {})]


async def _all(aws: Iterable[Awaitable[None]]) -> None:
    """Await all of ``aws`` to the end (none left running behind), then raise the first
    error: the caller's next step must see every move finished or failed."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def plan_moves(
    owners: Mapping[int, int], processes: Sequence[int], total_queues: int
) -> dict[int, tuple[int | None, int]]:
    """The queues to move for an even split over ``processes`` (child numbers), given
    ``owners`` (queue -> child number): queue -> (from, to), from None for a queue owned
    by nobody. The dynamic balancer's sticky rule (:func:`sticky_split`): a process
    keeps what it holds up to its share, so adding or removing one moves only the
    surplus — the new process's share, or the removed one's queues."""
    split = sticky_split([str(n) for n in processes], total_queues,
                         {q: str(n) for q, n in owners.items()})
    return {
        q: (owners.get(q), int(member))
        for member, queues in split.items()
        for q in queues
        if owners.get(q) != int(member)
    }


def choose_victim(lag_by_process: list[int], numbers: list[int], idle_lag: int) -> int | None:
    """Index of the process to remove: an idle one, least lag first, then the newest."""
    idle = [
        (lag, -number, i)
        for i, (lag, number) in enumerate(zip(lag_by_process, numbers, strict=True))
        if lag <= idle_lag
    ]
    return min(idle)[2] if idle else None


def parse_processes(text: str) -> tuple[int, int]:
    """``"2:6"`` -> (2, 6); ``"3"`` -> (3, 3)."""
    low, sep, high = text.partition(":")
    try:
        lo = int(low)
        hi = int(high) if sep else lo
    except ValueError:
        raise InvalidArgumentError(f"expected MIN:MAX (e.g. 1:4), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise InvalidArgumentError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def env_for_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """CLI overrides as ``CONVEYOR_SECTION__FIELD`` variables, so children see them too."""
    return {
        f"CONVEYOR_{section.upper()}__{name.upper()}": json.dumps(value)
        for section, values in overrides.items()
        for name, value in values.items()
    }


def run_supervisor(
    app_path: str,
    app_name: str,
    config: Config,
    processes: str,
    config_path: os.PathLike[str] | str | None,
    overrides: Mapping[str, Mapping[str, Any]],
    ready: Callable[[str], None] | None = None,
) -> DrainReport:
    """What ``conveyor worker --processes`` runs: until SIGINT/SIGTERM, then drain all.

    ``ready`` gets the daemon ids of the first processes once they own every queue; the
    result adds up the drain reports of every process stopped meanwhile (scaled down,
    then the rest), as one daemon's drain report reads."""
    import signal

    from conveyor.workers.daemon import DrainReport

    low, high = parse_processes(processes)
    settings = SupervisorSettings.from_config(config, low, high)
    telemetry = Telemetry.from_config(config.telemetry, prometheus=config.http.port is not None)
    try:
        supervisor = Supervisor(
            app_path, app_name, config, settings,
            config_path=None if config_path is None else str(config_path),
            env=env_for_overrides(overrides), telemetry=telemetry,
        )
    except BaseException:  # e.g. the memory adapter, refused: flush nothing half-made
        telemetry.shutdown()
        raise

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        endpoint = None
        if config.http.port is not None:  # one endpoint, the children's behind it
            from conveyor.workers.supervisor_http import supervisor_endpoint

            endpoint = supervisor_endpoint(supervisor, telemetry, config.http.host,
                                           config.http.port)
            await endpoint.start()
        try:
            await supervisor.run(stop, ready)
        finally:
            if endpoint is not None:
                await endpoint.close()

    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown()
    fields = {f.name for f in dataclasses.fields(DrainReport)}
    return DrainReport(**{name: supervisor.drained.get(name, 0) for name in fields})
