"""Run one worker daemon in a process until it is told to stop: ``conveyor worker`` and
the children of ``conveyor worker --processes`` both do it through :func:`serve`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from conveyor.platform.errors import ConveyorError
from conveyor.platform.tasks import cancel_and_wait, retrieve
from conveyor.workers.daemon import DrainReport, WorkerDaemon
from conveyor.workers.http_endpoint import HttpEndpoint

log = logging.getLogger("conveyor.daemon")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")


STOP_GRACE_S = 3.0
"""How long past ``drain_timeout_s`` (counted from the signal) a stop may take in all —
releasing leases, leaving the membership, closing connections — before serve abandons
it (:data:`CLOSE_AFTER_ABORT_S`): a handler call that catches its cancellation and goes
on, or a broker that stopped answering, must not keep a stopping worker alive."""

CLOSE_AFTER_ABORT_S = 2.0
"""How long an abandoned stop (past :data:`STOP_GRACE_S`, or at a second stop signal)
still has to close once its queues are aborted — nothing more acknowledged, no handler
call waited for: leave the consumer group (kafka-group) or the membership, release the
leases, close the broker's connections, so that the other workers take its queues at
once rather than after the group's session timeout or the leases' TTL. Two seconds:
what that takes with a broker that answers (a LeaveGroup, a few deletes; the Kafka
balancer's own waits are 2 s at most), and it keeps a stuck stop's exit within
``drain_timeout_s`` + 3 + 2 + :data:`THREADS_GRACE_S` + :data:`TASKS_GRACE_S` +
:data:`ATEXIT_GRACE_S` s, inside the pod's grace (``conveyor deploy kubernetes``:
``drain_timeout_s`` + 3 + 5 s). Past
it the process leaves as it is, and the broker's timeouts hand its queues on."""


THREADS_GRACE_S = 1.0
"""How long a process that has served its daemon waits for threads that would keep it
alive (:func:`leave_running_threads`) before it exits without them."""

ATEXIT_GRACE_S = 1.0
"""How long a process that has served its daemon, and leaves with nothing running, gives
the ``atexit`` functions Python then runs (:func:`_bound_atexit`) before it exits
without them."""

TASKS_GRACE_S = 1.0
"""How long :func:`run_served` waits for the tasks still there after its daemon's stop,
once cancelled, before it leaves them (a handler call that catches its cancellation
and goes on: an abandoned stop left it running)."""

INTERRUPTED = 130
"""The exit status of a worker process that a handler's ``KeyboardInterrupt`` ended: a
shell's for Ctrl-C."""

EXITING = "the process exits"
"""The message of the cancellations :func:`run_served` sends the tasks left at the end:
a cancellation that is no stop's (the agent's runners tell a handler's own by it)."""

_tasks_left: list[str] = []
"""The names of the tasks :func:`run_served` left running: :func:`leave_running_threads`
then leaves at once, as for a thread that does not end."""


_Callback = tuple[Callable[..., object], tuple[object, ...]]


class ServingLoop(asyncio.SelectorEventLoop):
    """The event loop of :func:`run_served`. :func:`serve` stops the daemon on its stop
    signals through :meth:`add_stop_handler`; a handler an app adds later for one of
    them with ``add_signal_handler`` (a startup hook's cleanup, asyncio's idiom) is
    called beside the stop, not in its place — as one installed with ``signal.signal``
    is — and ``remove_signal_handler`` removes the app's only."""

    def __init__(self) -> None:
        super().__init__()
        self._stops: dict[int, _Callback] = {}
        self._apps: dict[int, _Callback] = {}

    def add_stop_handler(self, sig: int, callback: Callable[..., object],
                         *args: object) -> None:
        self._stops[sig] = (callback, args)
        super().add_signal_handler(sig, self._signalled, sig)

    def remove_stop_handler(self, sig: int) -> None:
        del self._stops[sig]
        app = self._apps.pop(sig, None)
        if app is None:
            super().remove_signal_handler(sig)
        else:  # the app's stays, alone
            super().add_signal_handler(sig, app[0], *app[1])

    def add_signal_handler(self, sig: int, callback: Callable[..., object],
                           *args: object) -> None:
        if sig not in self._stops:
            super().add_signal_handler(sig, callback, *args)
        else:
            self._apps[sig] = (callback, args)

    def remove_signal_handler(self, sig: int) -> bool:
        if sig not in self._stops:
            return super().remove_signal_handler(sig)
        return self._apps.pop(sig, None) is not None

    def _signalled(self, sig: int) -> None:
        stop = self._stops.get(sig)  # None: it came as serve ended (asyncio's ignore it)
        if stop is not None:
            stop[0](*stop[1])
        app = self._apps.get(sig)
        if app is not None:  # its own callback: what it raises is reported as asyncio does
            self.call_soon(app[0], *app[1])


def run_served(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` for a process that exists to serve a daemon, without
    waiting for good at the end for what an abandoned stop left running:

    * the loop's default executor (``asyncio.to_thread``, ``run_in_executor``), where a
      handler's call its drain abandoned may never return: its idle threads end, a busy
      one is left to :func:`leave_running_threads`;
    * the tasks still there, which ``asyncio.run`` cancels and waits for: one running a
      handler call that catches its cancellation and goes on never ends. They get
      :data:`TASKS_GRACE_S`; those left then are named by :func:`leave_running_threads`,
      which leaves without them.

    Nor does it end when a Python signal handler the app installed raises (``sys.exit()``
    on SIGTERM, a timeout on SIGALRM): it runs wherever the main thread is, mostly in the
    loop's wait, and its exception would end the process undrained. It is logged and the
    loop runs on (on a stop signal, the daemon's own handler drains it as ever)."""
    executor = ThreadPoolExecutor(thread_name_prefix="asyncio")
    loop = ServingLoop()
    asyncio.set_event_loop(loop)
    loop.set_default_executor(executor)
    try:
        served = loop.create_task(main())
        said = False
        while True:
            try:
                return loop.run_until_complete(served)
            except BaseException as exc:
                if served.done():  # main's own error
                    raise
                sig = _raised_by_signal_handler(exc)
                if sig is not None:
                    log.error("the app's signal handler for %s raised %r in the event "
                              "loop's wait: the worker goes on", sig.name, exc)
                    continue
                if not isinstance(exc, RuntimeError):
                    raise  # a handler's or hook's SystemExit or KeyboardInterrupt
            # loop.stop() from a handler or hook, a script's habit: it ended the worker
            # undrained, with a traceback. It runs on, as nothing asked it to stop.
            if not said:
                said = True
                log.warning("a handler or hook stopped the event loop (loop.stop()): the "
                            "worker runs it again and goes on; stop a worker with SIGTERM "
                            "or sys.exit()")
    finally:
        try:
            _cancel_left_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


def _raised_by_signal_handler(exc: BaseException) -> signal.Signals | None:
    """The signal whose Python handler raised ``exc`` in the event loop's own code (its
    wait), or None: it came from elsewhere. (One that lands in a task's code — a
    handler's call — is that call's failure, as what it raises itself is.)"""
    handlers = {}
    for sig in signal.valid_signals():
        code = getattr(signal.getsignal(sig), "__code__", None)
        if code is not None:
            handlers[code] = signal.Signals(sig)
    tb, landed = exc.__traceback__, ""
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            loops = landed.startswith("asyncio.") or landed == "selectors"
            return handlers[tb.tb_frame.f_code] if loops else None
        landed = tb.tb_frame.f_globals.get("__name__", "")
        tb = tb.tb_next
    return None


def _cancel_left_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does with the tasks ``main`` left, within :data:`TASKS_GRACE_S`:
    cancel them, wait, report the errors they ended with; remember those still running."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel(EXITING)
    if not tasks:
        return
    done, running = loop.run_until_complete(asyncio.wait(tasks, timeout=TASKS_GRACE_S))
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": task.exception(), "task": task})
    _tasks_left.extend(task.get_name() for task in running)


def stopped_status(exc: SystemExit | KeyboardInterrupt) -> int:
    """The exit status of a worker process that a handler or hook stopped by raising
    ``exc`` (the agent logged it): :data:`INTERRUPTED` for ``KeyboardInterrupt``, the
    ``SystemExit``'s status, or 1 for none or 0 — never the 0 of a drain."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    return exc.code if isinstance(exc.code, int) and exc.code else 1


def leave_running_threads(status: int, grace_s: float = THREADS_GRACE_S) -> None:
    """The last call of a process that served a daemon, once the daemon has stopped:
    Python would wait at exit for every thread that is not a daemon thread — for good,
    if one never returns (a handler's ``asyncio.to_thread`` call the drain abandoned, a
    thread the app started at import). Waits ``grace_s`` at most for them; if one still
    runs, or :func:`run_served` left a task running, logs their names and leaves at once
    with ``status`` (``os._exit``: ``atexit`` functions do not run). Returns when none
    is left, the exit's ``atexit`` functions bounded by :data:`ATEXIT_GRACE_S`."""
    if _tasks_left:
        log.warning("exiting without waiting for %d task(s) still running after their "
                    "cancellation: %s (a handler or startup hook that catches "
                    "asyncio.CancelledError and goes on)", len(_tasks_left), ", ".join(_tasks_left))
    deadline = time.monotonic() + grace_s
    _end_idle_executors()
    running = []
    for thread in threading.enumerate():
        if thread.daemon or thread is threading.current_thread():
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            running.append(thread.name)
    if not running and not _tasks_left:
        atexit.register(_bound_atexit, status)  # the last registered: run first
        return
    if running:
        log.warning("exiting without waiting for %d thread(s) still running after the "
                    "stop: %s (a handler's asyncio.to_thread or run_in_executor call that "
                    "has not returned, or a thread the app started that is not a daemon "
                    "thread)", len(running), ", ".join(running))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):  # a handler may have closed or dropped one
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(status)


def _end_idle_executors() -> None:
    """Do first what Python's exit does before it waits for threads: run the calls
    registered with ``threading._register_atexit`` — ``concurrent.futures`` tells the
    threads of an app's executors (a ``ThreadPoolExecutor``, a ``ProcessPoolExecutor``'s
    manager) to end once idle, and waits for them. Else an idle executor's threads,
    waiting for work until then, would pass for calls that have not returned. On a
    daemon thread of their own, so a call that never returns holds only that one."""
    calls = list(reversed(getattr(threading, "_threading_atexits", [])))
    if calls:
        threading.Thread(target=lambda: [call() for call in calls],
                         name="conveyor-executors-exit", daemon=True).start()


def _bound_atexit(status: int, grace_s: float = ATEXIT_GRACE_S) -> None:
    """The first ``atexit`` function of a process that served its daemon: the others —
    ``multiprocessing`` joining a process the app started that is not a daemon process,
    a hook of the app's — would hold the exit for good if one never returned. A daemon
    thread leaves ``grace_s`` later with ``status``, naming the function still running;
    an exit done by then ends that thread with the process."""
    def leave() -> None:
        time.sleep(grace_s)
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        while frame is not None and frame.f_back is not None:
            frame = frame.f_back  # the outermost: the function atexit called
        name = ("an atexit function" if frame is None else "the atexit function "
                f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}")
        log.warning("exiting without waiting for %s, still running %.1fs after the stop "
                    "(a process the app started that is not a daemon process, or a hook "
                    "of the app's)", name, grace_s)
        logging.shutdown()
        os._exit(status)

    threading.Thread(target=leave, name="conveyor-exit", daemon=True).start()


def _enable_own_loggers() -> None:
    """Enable Conveyor's loggers (``conveyor.*``) that the app's logging config disabled:
    ``logging.config.dictConfig`` and ``fileConfig`` disable every logger that exists and
    that they do not name, unless given ``disable_existing_loggers: False`` — run at an
    app's import, where Conveyor's all exist, they silenced every warning and error of the
    worker (a dead letter, a crash, the stop). Their lines then go where the app's config
    sends the root logger's."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (isinstance(logger, logging.Logger) and logger.disabled
                and (name == "conveyor" or name.startswith("conveyor."))):
            logger.disabled = False


async def serve(
    daemon: WorkerDaemon,
    *,
    ready: Callable[[], None] | None = None,
    commands: Callable[[], Awaitable[None]] | None = None,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    freeze_heap: bool = True,
    endpoint: HttpEndpoint | None = None,
) -> DrainReport:
    """Start ``daemon``, wait to be told to stop, stop it; return what the stop did.

    1. Handlers for ``signals`` are installed before the start, and stay until the stop
       is done. A signal during the start cancels it (a worker that cannot reach its
       broker still stops at once). ``endpoint`` (``/metrics`` and the probes) listens
       before the start — a port it cannot bind fails here, before the daemon joins —
       and until the stop is done, answering ``/readyz`` with 503 while starting and
       draining.
    2. The daemon starts; with ``freeze_heap`` what was built until it takes its first
       queue is exempted from later GC passes (:func:`freeze_startup_heap`, for a
       process that exists to run this daemon); ``ready()`` is called.
    3. It runs until a signal arrives, ``commands()`` (run once ready, e.g. a
       supervisor's command stream) returns, or the daemon fails
       (:attr:`WorkerDaemon.failed`). ``commands`` still running then is cancelled and
       awaited, so it may finish what it had begun.
    4. The daemon stops (:meth:`WorkerDaemon.stop`: drains), with
       ``[worker] drain_timeout_s`` counted from the signal. A second signal abandons
       the stop: no more waiting for handlers, nothing more acknowledged (``abandoned``
       counts what is left to the queues' next owners), and it still closes — leaves
       the group or membership, releases the leases — within
       :data:`CLOSE_AFTER_ABORT_S`. A stop still running :data:`STOP_GRACE_S` past its
       drain deadline is abandoned the same way (:func:`_abandon`). A failure is then
       raised (as a :class:`ConveyorError`); otherwise the :class:`DrainReport` is
       returned.
    """
    loop = asyncio.get_running_loop()
    stop = _StopRequest()
    for sig in signals:
        if isinstance(loop, ServingLoop):
            loop.add_stop_handler(sig, stop.signal_received, sig)
        else:
            loop.add_signal_handler(sig, stop.signal_received, sig)
    try:
        _enable_own_loggers()  # the app's import configured logging
        if endpoint is not None:
            await endpoint.start()
        if await _start(daemon, stop, freeze_heap):
            _enable_own_loggers()  # so may its startup hooks have, as they began
            if ready is not None:
                ready()
            await _until_stop(daemon, stop, commands)
        deadline = (stop.at or loop.time()) + daemon.config.worker.drain_timeout_s
        report = await _stop(daemon, deadline, stop)
    finally:
        for sig in signals:
            if isinstance(loop, ServingLoop):
                loop.remove_stop_handler(sig)
            else:
                loop.remove_signal_handler(sig)
        if endpoint is not None:
            await endpoint.close()
    failure = daemon.failure
    if failure is not None:  # it can never own a queue: stopped, now say why
        if isinstance(failure, ConveyorError):
            raise failure
        raise ConveyorError(f"the daemon failed: {failure}") from failure
    return report


async def _start(daemon: WorkerDaemon, stop: _StopRequest, freeze_heap: bool) -> bool:
    """Start the daemon unless a stop signal comes first (then the start is cancelled)."""
    starting = asyncio.ensure_future(daemon.start(freeze_heap=freeze_heap))
    asked = asyncio.ensure_future(stop.asked.wait())
    try:
        await asyncio.wait([starting, asked], return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
    if not starting.done():
        await cancel_and_wait(starting)
        log.info("stopped while starting")
        return False
    starting.result()  # a failed start is raised, as before
    return True


async def _stop(daemon: WorkerDaemon, deadline: float, stop: _StopRequest) -> DrainReport:
    """The one place a served daemon is stopped: its stop runs in a task of its own, so
    that a handler call that catches its cancellation and goes on, holding the drain,
    cannot hold this too; at ``deadline`` + :data:`STOP_GRACE_S`, or at a second signal,
    it is abandoned (:func:`_abandon`)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.ensure_future(daemon.stop(deadline))
    again = asyncio.ensure_future(stop.again.wait())
    grace_s = max(deadline + STOP_GRACE_S - loop.time(), 0.0)
    try:
        await asyncio.wait({stopping, again}, timeout=grace_s,
                           return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        stopping.cancel()
        raise
    finally:
        again.cancel()
    if stopping.done():
        return stopping.result()
    if stop.again.is_set():
        log.warning("second stop signal: stopping at once; unacknowledged messages go to "
                    "the queues' next owners")
    else:
        log.error("the stop took longer than drain_timeout_s + %.0fs: stopping at once; "
                  "what was not acknowledged goes to the queues' next owners", STOP_GRACE_S)
    return await _abandon(daemon, stopping)


async def _abandon(daemon: WorkerDaemon, stopping: asyncio.Future[DrainReport]) -> DrainReport:
    """Abort the daemon's queues — nothing more acknowledged, handler calls cancelled and
    not waited for (a call that ignores its cancellation is left running) — and let the
    stop under way, no longer held by them, close: leave the consumer group or the
    membership, release the leases, close the connections. All within
    :data:`CLOSE_AFTER_ABORT_S`; past it the process leaves without (the broker then
    hands its queues on after the group's session timeout or the leases' TTL)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + CLOSE_AFTER_ABORT_S
    aborting = asyncio.ensure_future(daemon.abort())
    aborting.add_done_callback(retrieve)
    try:
        await asyncio.wait({aborting}, timeout=CLOSE_AFTER_ABORT_S)
        await asyncio.wait({stopping}, timeout=max(until - loop.time(), 0.0))
    except BaseException:
        stopping.cancel()
        raise
    if stopping.done():
        return stopping.result()
    log.error("the stop did not close within %.0fs of its abort (leaving the group or "
              "membership, releasing the leases): leaving without; the broker hands the "
              "queues on once the group's session or the leases expire", CLOSE_AFTER_ABORT_S)
    aborting.cancel()
    stopping.cancel()
    stopping.add_done_callback(retrieve)
    return daemon.report()


class _StopRequest:
    """Where a stop signal is received: the one place to change what a signal means.

    The first asks for a drain (and remembers when: the drain timeout counts from it);
    any later one sets ``again`` (the stop is abandoned: :func:`_abandon`).
    """

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.again = asyncio.Event()
        self.at: float | None = None

    def signal_received(self, sig: signal.Signals) -> None:
        if self.asked.is_set():
            self.again.set()
            return
        log.info("%s received: draining", sig.name)
        self.at = asyncio.get_running_loop().time()
        self.asked.set()


async def _until_stop(
    daemon: WorkerDaemon, stop: _StopRequest, commands: Callable[[], Awaitable[None]] | None
) -> None:
    """Wait for a signal, the daemon's failure or ``commands`` returning; then cancel
    ``commands`` if it is still running and wait for it to finish. ``commands`` failing
    is logged and stops the daemon like its return."""
    waits: list[asyncio.Task[Any]] = [
        asyncio.create_task(stop.asked.wait()), asyncio.create_task(daemon.failed.wait())
    ]
    if commands is not None:
        waits.append(asyncio.ensure_future(commands()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        try:
            await cancel_and_wait(*waits)
        except Exception:
            log.exception("the daemon's commands failed: stopping")
