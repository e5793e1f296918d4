"""The worker daemon: one process's share of an app's queues, pulled and handled.

It joins the balancer, starts a :class:`PullingAgent` for every queue it is given,
drains the ones it gives back, aborts the ones whose lease is lost, and on
:meth:`WorkerDaemon.stop` drains everything: stops pulling, lets in-flight messages
finish within ``drain_timeout_s``, acknowledges them and releases its queues.

:class:`WorkerDaemon` is the facade users and tests hold; each job is a part of its own:

* ``build.py``    :func:`build_parts` — adapter, slots, balancer, member, telemetry,
                  dead letters and delivery chains, from config; closes what it built
* ``queues.py``   :class:`QueueOwner` — an agent per owned queue: acquire, drain, abort;
                  :class:`DrainReport`
* ``metrics.py``  :class:`DaemonMetrics` — instruments, lag sampling, slot gauges, the
                  stats snapshot published for ``conveyor status`` and placement

Running a daemon in a process until a signal is :func:`conveyor.workers.serve.serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import logging
from collections.abc import Callable

from conveyor.platform import forks
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.agent import PullingAgent
from conveyor.platform.app import App
from conveyor.platform.backend import Backend
from conveyor.platform.backoff import BROKER_WRITE
from conveyor.platform.balancing.balancer import QueueBalancer
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.config import Config, require_config
from conveyor.platform.errors import (
    BrokerConnectionError,
    ConfigError,
    ConveyorError,
    InvalidArgumentError,
    ShutdownError,
    error_text,
)
from conveyor.platform.slots import SlotSupplier, require_supplier
from conveyor.platform.tasks import cancel_and_wait, cancel_and_wait_at_most
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.cells.cells import CellRouter
from conveyor.workers.daemon.build import DaemonParts, build_balancer, build_parts
from conveyor.workers.daemon.metrics import DaemonMetrics
from conveyor.workers.daemon.queues import DrainReport, QueueOwner
from conveyor.workers.pools.pool import StatelessWorkerPool
from conveyor.workers.resources import ResourceSampler
from conveyor.workers.threads import HandlerThreads

__all__ = [
    "DaemonMetrics",
    "DaemonParts",
    "DrainReport",
    "QueueOwner",
    "WorkerDaemon",
    "build_balancer",
    "build_parts",
]

log = logging.getLogger("conveyor.daemon")

READY_CHECK_S = 0.05
"""How often :meth:`WorkerDaemon.when_ready` looks again while the daemon joins."""

HOOKS_GRACE_S = 1.0
"""How long :meth:`WorkerDaemon.stop` waits for the startup hooks, once cancelled, before
it goes on without them: a hook that catches its cancellation and goes on (a poller's
``except asyncio.CancelledError: pass`` in a loop) must not hold the queues' release."""

HOOK_TASK_PREFIX = "startup hook "
"""A startup hook's task is named this and the hook's name (the name a stop that had to
leave it running gives)."""

SERVER_CHECK_WAIT_S = 2.0
"""How long a daemon's start waits for the broker to answer the check of its settings
(:meth:`QueueAdapter.check_server`); past that it starts and checks in the background
(a refusal then fails the daemon, and the writes a refused setting would endanger are
refused on their own). A broker that accepts connections and stays silent would hold
the start for the client's request timeout (aiokafka's admin client: 40 s); the start
waits for the broker's first answer after this, too (Kafka: ``FIRST_ANSWER_S``)."""

SERVER_RECHECK_S = 60.0
"""How often a running daemon looks again at the broker settings it checked at start
(:meth:`QueueAdapter.recheck_server`: Redis' eviction policy and persistence, changed
meanwhile)."""


class WorkerDaemon:
    """One process's worker for an app: owns its share of the queues and runs the handlers.

    ``await start()`` joins the balancer and starts a pulling agent per queue it is given;
    ``await stop()`` drains (stops pulling, lets in-flight messages finish within
    ``[worker] drain_timeout_s``, acknowledges them, releases the queues) and returns a
    :class:`DrainReport`. Everything is built from ``config`` unless passed in (tests,
    embedding): the adapter, balancer, slot supplier, member identity and telemetry — what
    is passed in is left open on stop. If its balancer fails for good, :attr:`failed` is
    set and :attr:`failure` says why (``conveyor worker`` then stops the daemon and exits
    non-zero). It is its balancer's listener.

    ``resource_sampler`` is where the CPU and memory it publishes for placement are
    read (default: this process's cgroup v2, else the host; see
    :mod:`conveyor.workers.resources`). ``backend`` is what the broker's parts are built
    from (default: the config's, ``conveyor.backends.for_config``).
    """

    def __init__(
        self,
        app: App,
        config: Config | None = None,
        *,
        adapter: QueueAdapter | None = None,
        balancer: QueueBalancer | None = None,
        slots: SlotSupplier | None = None,
        member: MemberInfo | None = None,
        telemetry: Telemetry | None = None,
        resource_sampler: ResourceSampler | None = None,
        backend: Backend | None = None,
    ) -> None:
        if not isinstance(app, App):
            raise InvalidArgumentError(
                f"WorkerDaemon(app): expected a conveyor.App, got {type(app).__name__} "
                f"{app!r:.80}")
        if config is not None:
            require_config(config, "WorkerDaemon(config)")
        if slots is not None:
            require_supplier(slots, "WorkerDaemon(slots)")
        self._parts = parts = build_parts(
            app, config, adapter=adapter, balancer=balancer, slots=slots, member=member,
            telemetry=telemetry, resource_sampler=resource_sampler, backend=backend,
        )
        self.app = app
        self.config = parts.config
        self.adapter = parts.adapter
        self.mapper = parts.mapper
        self.slots = parts.slots
        self.balancer = parts.balancer
        self.member = parts.member
        self.stats = parts.stats
        self.telemetry = parts.telemetry
        self.dead_letters = parts.dead_letters
        self.client = parts.client
        self.settings = parts.settings
        self.orphans = parts.orphans
        self.interceptors = parts.interceptors
        self.queues = QueueOwner(
            parts.adapter, app.name, parts.subscriptions, parts.orphans, parts.slots,
            parts.settings, parts.balancer, parts.config.worker, parts.watchdog,
            self.agent_crashed,
        )
        self.agents: dict[int, PullingAgent] = self.queues.agents
        self.metrics = DaemonMetrics(
            parts.telemetry, parts.stats, parts.slots, self.queues, app.handlers,
            parts.pool_step.pools, parts.cell_step.routers, parts.dead_letters,
            parts.resources, lag_interval_s=parts.config.telemetry.metrics_interval_s,
            watchdog=parts.watchdog,
        )
        self._hooks: list[asyncio.Task[None]] = []
        self._announcing: asyncio.Task[None] | None = None
        self._start_called = False
        self._starting: asyncio.Future[None] | None = None
        """The start under way, which a stop ends."""
        self.started = False
        self.failure: BaseException | None = None
        """Why the daemon can no longer work (set with :attr:`failed`); None while fine."""
        self.failed = asyncio.Event()
        self.draining = False
        """Set when :meth:`stop` begins: ``/readyz`` answers 503 from then on."""
        app.hold(self)  # the handlers are those of now: a later one is refused (App.hold)

    @property
    def pools(self) -> dict[str, StatelessWorkerPool]:
        """Stateless-worker pools by handler name."""
        return self._parts.pool_step.pools

    @property
    def cells(self) -> dict[str, CellRouter]:
        """Cells by handler name."""
        return self._parts.cell_step.routers

    @property
    def threads(self) -> HandlerThreads:
        """Where plain ``def`` handlers run (:mod:`conveyor.workers.threads`)."""
        return self._parts.threads

    @property
    def lag(self) -> dict[int, int]:
        """Messages not yet finished, per owned queue, as last sampled (metrics on)."""
        return self.metrics.lag

    def resize_cell(self, handler: str, cell: str, size: int) -> None:
        """Change one cell's size while running (creates nothing until its first message)."""
        router = self.cells.get(handler)
        if router is None:
            raise InvalidArgumentError(
                f"resize_cell: handler {handler!r} has no cells "
                f"(handlers with cells: {', '.join(sorted(self.cells)) or 'none'})"
            )
        router.resize(cell, size)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, *, freeze_heap: bool = False) -> None:
        """Check the broker, join, take the queues the balancer hands out (their agents
        start pulling at once). With ``freeze_heap`` (a process that exists to run this
        daemon: :func:`~conveyor.workers.serve.serve`), what was built so far — modules,
        the app, config, connections — is exempted from later GC passes just before the
        first queue is taken (:func:`freeze_startup_heap`): its collection (10-40 ms for
        a heap of 25k-100k objects) is part of the start, not a pause of the first
        messages'."""
        if self.draining:  # its adapter, client and threads are closed: it would do nothing
            raise ShutdownError("this WorkerDaemon is stopped: a daemon starts once (make a "
                                "new WorkerDaemon to start again)")
        if self._start_called:  # a second start would join the balancer again
            raise ConveyorError("this WorkerDaemon is started already: start it once "
                                "(stop() then drains it)")
        self._start_called = True
        # A task of its own, so that a stop() meanwhile can end it (:meth:`stop`).
        self._starting = starting = asyncio.ensure_future(self._start(freeze_heap))
        try:
            await starting
        except asyncio.CancelledError:
            self._start_called = False
            current = asyncio.current_task()
            if self.draining and not (current is not None and current.cancelling()):
                raise ShutdownError("this WorkerDaemon was stopped while it started") from None
            raise
        except BaseException:
            self._start_called = False  # a failed start may be tried again, as before
            forks.release(self)
            raise
        finally:
            self._starting = None

    async def _start(self, freeze_heap: bool) -> None:
        if not self.app.handlers:
            fate = ("dead-lettered" if self.config.dead_letters.unroutable == "dead-letter"
                    else "skipped (acknowledged unhandled)")
            log.warning("app %r declares no handlers: every message will be %s "
                        "([dead_letters] unroutable = %r)", self.app.name, fate,
                        self.config.dead_letters.unroutable)
        self.client.bind_to_running_loop()  # a handler thread's publish is refused
        await self._check_server()
        self.balancer.set_stats_provider(self.stats_snapshot)
        self.balancer.set_app([h.name for h in self.app.handlers],
                             sorted(self.app.subscriptions()))
        self._parts.watchdog.start()
        if freeze_heap:
            freeze_startup_heap()
        forks.guard(self, asyncio.get_running_loop())  # before its first handler call
        await self.balancer.start(self.member, self)
        self.started = True
        self.metrics.register()
        for hook in self.app.on_startup:
            name = getattr(hook, "__qualname__", repr(hook))
            task = asyncio.create_task(hook(self.client), name=HOOK_TASK_PREFIX + name)
            task.add_done_callback(functools.partial(_log_hook_failure, name))
            self._hooks.append(task)
        log.info("daemon %s started; owns queues %s", self.member.id, self.balancer.owned())

    async def _check_server(self) -> None:
        """The broker's own settings (Redis: its eviction policy, and its persistence,
        which is only logged; Kafka: its dead-letter topics' compaction, and their
        retention, only logged): one refused fails the start (a ConfigError: ``conveyor
        worker`` exits 2). A broker that does not answer yet (or not within
        :data:`SERVER_CHECK_WAIT_S`) is checked in the background until it does, and a
        refusal then fails the daemon (:attr:`failure`), as a balancer that fails for
        good does."""
        try:
            await asyncio.wait_for(self.adapter.check_server(), SERVER_CHECK_WAIT_S)
        except (BrokerConnectionError, TimeoutError) as exc:
            why = str(exc) or f"no answer in {SERVER_CHECK_WAIT_S:g}s"
            log.warning("could not check the broker's settings at start (%s); checking "
                        "once it answers", why)
            self._hooks.append(asyncio.create_task(self._check_server_later(),
                                                   name="check-server"))
        else:
            self._hooks.append(asyncio.create_task(self._recheck_server(),
                                                   name="recheck-server"))

    async def _check_server_later(self) -> None:
        for failures in itertools.count(1):
            await BROKER_WRITE.sleep(failures)
            try:
                await self.adapter.check_server()
            except BrokerConnectionError:
                continue
            except ConfigError as exc:
                self.balancer_failed(exc)
                return
            await self._recheck_server()

    async def _recheck_server(self) -> None:
        """:meth:`QueueAdapter.recheck_server` every :data:`SERVER_RECHECK_S`, for good;
        a broker that does not answer is asked again at the next look."""
        while True:
            await asyncio.sleep(SERVER_RECHECK_S)
            with contextlib.suppress(ConveyorError):
                await self.adapter.recheck_server()

    async def stop(self, deadline: float | None = None) -> DrainReport:
        """Drain: stop the startup hooks (waiting :data:`HOOKS_GRACE_S` at most), release
        every queue through the balancer (all drained together, by ``deadline`` —
        event-loop time, default: now plus ``[worker] drain_timeout_s``), drain what it
        did not hand back, then close the parts built here. :meth:`abort` while this runs
        makes it end at once. A start still under way (a broker that does not answer
        yet) is ended first: its :meth:`start` raises :class:`ShutdownError`."""
        self.draining = True
        if self._starting is not None:  # a start under way would join after the stop
            self._starting.cancel()
            await asyncio.wait({self._starting})
        loop = asyncio.get_running_loop()
        self.queues.stop_by(
            deadline if deadline is not None
            else loop.time() + self.config.worker.drain_timeout_s
        )
        await self._stop_hooks()
        if self._announcing is not None:
            await cancel_and_wait(self._announcing)
        if self.started:
            await self.balancer.stop()
            self.started = False
        await self.queues.drain_all()
        await self.metrics.close()
        await self._parts.close()
        self._parts.watchdog.stop()
        self.app.release(self)
        forks.release(self)
        return self.report()

    async def _stop_hooks(self) -> None:
        """Cancel the startup hooks (and the server checks) and wait for them
        :data:`HOOKS_GRACE_S` at most: one that catches its cancellation and goes on is
        named and left running — the queues are released without it (``conveyor
        worker`` then exits without it too). A hook's failure was its own business
        (:func:`_log_hook_failure`)."""
        left = await cancel_and_wait_at_most(HOOKS_GRACE_S, *self._hooks)
        if left:
            log.warning("startup hook(s) still running after their cancellation: %s — a "
                        "hook that catches asyncio.CancelledError must raise it again; the "
                        "stop goes on without waiting for it", ", ".join(
                            task.get_name().removeprefix(HOOK_TASK_PREFIX) for task in left))

    async def abort(self) -> None:
        """Stop every queue at once (a second stop signal): nothing more is acknowledged;
        what was in flight is counted in ``abandoned`` and redelivered to the queues' next
        owners. A :meth:`stop` under way then finishes without waiting for handlers."""
        await self.queues.abort_all()

    def readiness(self) -> str | None:
        """None when ready to work — started, joined (its share of the queues held or
        being taken), not draining, not failed; else why not, in a few words (``/readyz``).
        Owning no queue is ready: more daemons than queues is a valid deployment."""
        if self.failure is not None:
            return f"failed: {self.failure}"
        if self.draining:
            return "draining"
        if not self.started:
            return "starting"
        if not self.balancer.joined():
            return "not joined yet (membership or consumer group unreachable?)"
        return None

    def when_ready(self, ready: Callable[[], None],
                   waiting: Callable[[str], None] | None = None) -> None:
        """Call ``ready()`` once :meth:`readiness` says ready — at once if the daemon is.

        A started daemon may still be joining: on ``kafka-group`` the consumer group's
        first round assigns partitions seconds after the start (3 s on tansu), and a
        broker or store down at the start delays it further. Then ``waiting(what)`` is
        called at once with what it waits for, and ``ready()`` later, from a task that
        :meth:`stop` cancels (a daemon that fails or drains first is never ready).
        """
        if self.readiness() is None:
            ready()
            return
        if waiting is not None:
            waiting(self._waiting_for())

        async def announce() -> None:
            # Readiness has no event to wait on (the balancer port offers joined() only):
            # a look every READY_CHECK_S, once, while the daemon starts.
            while self.readiness() is not None:  # noqa: ASYNC110
                await asyncio.sleep(READY_CHECK_S)
            ready()

        self._announcing = asyncio.create_task(announce(), name="daemon-ready")

    def _waiting_for(self) -> str:
        if self.config.balancer.kind == "kafka-group":
            return f"consumer group {self.app.name!r} to assign its partitions"
        return f"membership store {self.config.balancer.membership!r} to answer"

    def report(self) -> DrainReport:
        return DrainReport(
            pulled=self.queues.pulled,
            acked=self.queues.acked,
            handled=self.stats.handled,
            dead_lettered=self.stats.dead_lettered,
            abandoned=self.queues.abandoned,
            skipped=self.stats.skipped,
            released=self.queues.released,
            moved=self.queues.moved,
        )

    def stats_snapshot(self) -> dict[str, float]:
        """Flat stats published with the membership record; read by ``conveyor status``
        and the console. ``ready`` is 1 when :meth:`readiness` says ready, else 0;
        ``draining`` (1) is there only while :meth:`stop` drains."""
        snapshot = self.metrics.stats_snapshot()
        snapshot["ready"] = 1 if self.readiness() is None else 0
        if self.draining:
            snapshot["draining"] = 1
        return snapshot

    def slot_metrics(self) -> dict[str, dict[str, int]]:
        """Slots in use and available, per handler and in total (see DaemonMetrics)."""
        return self.metrics.slot_metrics()

    @property
    def max_cache_fill(self) -> int:
        """The most messages any of this daemon's agents held at once, ever."""
        return self.queues.max_cache_fill

    # -- the balancer's listener -------------------------------------------------------
    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        await self.queues.queue_acquired(queue, lease)

    async def queue_released(self, queue: int) -> None:
        await self.queues.queue_released(queue)

    async def queue_lost(self, queue: int) -> None:
        await self.queues.queue_lost(queue)

    def agent_crashed(self, queue: int, error: BaseException) -> None:
        """An error of Conveyor's own ended a task of ``queue``'s agent (a handler's
        errors are its calls' failures, never this): the message it held would stay
        unfinished and the queue's acknowledgements stopped behind it for good. The
        daemon fails instead — drained and stopped by whoever runs it, ``conveyor
        worker`` exiting 1 — so that its restart (a supervisor, Kubernetes) redelivers
        what it held; a message that crashes it every time is counted and
        dead-lettered after ``max_deliveries``, as one that kills its worker is."""
        if self.failure is None:
            self.balancer_failed(ConveyorError(
                f"queue {queue}: an agent task crashed ({type(error).__name__}: {error}); "
                "the worker stops so that a restart redelivers what it held"))

    def balancer_failed(self, error: BaseException) -> None:
        """Recorded for whoever runs the daemon (:func:`~conveyor.workers.serve.serve`
        stops it and raises the failure)."""
        self.failure = error
        self.failed.set()


def _log_hook_failure(name: str, task: asyncio.Task[None]) -> None:
    """Log what a startup hook raised, when it raises: nothing else awaits its task (the
    stop cancels it and lets a failure be), so a hook whose publish failed went unseen and
    the worker ran on without the work it was meant to set up. With the traceback: no
    other line says where in the hook it failed."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("startup hook %s raised %s", name, error_text(exc), exc_info=exc)


def freeze_startup_heap() -> None:
    """Exempt what a worker process built at startup from later full GC passes.

    For processes that exist to run one daemon (``conveyor worker`` and its supervised
    children), called as the daemon starts (:meth:`WorkerDaemon.start`, before its
    first queue): modules, the app, config and connections live as long as the process,
    yet every full collection re-scanned them (~10 ms per pass for a ~25k-object heap on
    a 2-core VM, a pass every ~20k messages under load). ``gc.collect()`` first, so
    nothing already garbage is kept.
    """
    gc.collect()
    gc.freeze()
