"""Run one worker daemon in a process until it is told to stop: ``conveyor worker`` and
the children of ``conveyor worker --processes`` both do it through :func:`serve`.
"""

from __future__ import annotations

import asyncio
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
from conveyor.platform.tasks import cancel_and_wait
from conveyor.workers.daemon import DrainReport, WorkerDaemon
from conveyor.workers.http_endpoint import HttpEndpoint

log = logging.getLogger("conveyor.daemon")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")


STOP_GRACE_S = 3.0
"""How long past ``drain_timeout_s`` (counted from the signal) a stop may take in all —
releasing leases, leaving the membership, closing connections — before serve gives up
on it: a broker that stopped answering must not keep a stopping worker alive."""


THREADS_GRACE_S = 1.0
"""How long a process that has served its daemon waits for threads that would keep it
alive (:func:`leave_running_threads`) before it exits without them."""


def run_served(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` for a process that exists to serve a daemon, without
    waiting at the end for the loop's default executor (``asyncio.to_thread``,
    ``run_in_executor``): ``asyncio.run`` would wait for a call there that never returns
    — a handler's ``to_thread`` call its drain abandoned — for good, after the drain.
    The executor's idle threads end; a busy one is left to :func:`leave_running_threads`."""
    executor = ThreadPoolExecutor(thread_name_prefix="asyncio")

    async def served() -> T:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(executor)
        try:
            return await main()
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            # What asyncio.run shuts down (and waits for) once this returns: an idle one.
            loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))

    return asyncio.run(served())


def leave_running_threads(status: int, grace_s: float = THREADS_GRACE_S) -> None:
    """The last call of a process that served a daemon, once the daemon has stopped:
    Python would wait at exit for every thread that is not a daemon thread — for good,
    if one never returns (a handler's ``asyncio.to_thread`` call the drain abandoned, a
    thread the app started at import). Waits ``grace_s`` at most for them; if one still
    runs, logs their names and leaves at once with ``status`` (``os._exit``: ``atexit``
    functions do not run). Returns when none is left."""
    deadline = time.monotonic() + grace_s
    running = []
    for thread in threading.enumerate():
        if thread.daemon or thread is threading.current_thread():
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            running.append(thread.name)
    if not running:
        return
    log.warning("exiting without waiting for %d thread(s) still running after the stop: "
                "%s (a handler's asyncio.to_thread or run_in_executor call that has not "
                "returned, or a thread the app started that is not a daemon thread)",
                len(running), ", ".join(running))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


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
       ``[worker] drain_timeout_s`` counted from the signal. A second signal aborts: no
       more waiting for handlers, nothing more acknowledged (``abandoned`` counts what is
       left to the queues' next owners). A stop still running :data:`STOP_GRACE_S` past
       its drain deadline is abandoned the same way. A failure is then raised (as a
       :class:`ConveyorError`); otherwise the :class:`DrainReport` is returned.
    """
    loop = asyncio.get_running_loop()
    stop = _StopRequest(again=lambda: _abort(daemon))
    for sig in signals:
        loop.add_signal_handler(sig, stop.signal_received, sig)
    try:
        if endpoint is not None:
            await endpoint.start()
        if await _start(daemon, stop, freeze_heap):
            if ready is not None:
                ready()
            await _until_stop(daemon, stop, commands)
        deadline = (stop.at or loop.time()) + daemon.config.worker.drain_timeout_s
        report = await _stop(daemon, deadline)
    finally:
        for sig in signals:
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


async def _stop(daemon: WorkerDaemon, deadline: float) -> DrainReport:
    """The one place a served daemon is stopped: by ``deadline`` + STOP_GRACE_S at most."""
    try:
        async with asyncio.timeout_at(deadline + STOP_GRACE_S):
            return await daemon.stop(deadline)
    except TimeoutError:
        log.error("the stop took longer than drain_timeout_s + %.0fs: leaving now; what was "
                  "not acknowledged goes to the queues' next owners", STOP_GRACE_S)
        await daemon.abort()
        return daemon.report()


def _abort(daemon: WorkerDaemon) -> None:
    log.warning("second stop signal: stopping at once; unacknowledged messages go to the "
                "queues' next owners")
    task = asyncio.ensure_future(daemon.abort())
    _background.add(task)
    task.add_done_callback(_background.discard)


_background: set[asyncio.Future[None]] = set()


class _StopRequest:
    """Where a stop signal is received: the one place to change what a signal means.

    The first asks for a drain (and remembers when: the drain timeout counts from it);
    any later one calls ``again`` (an abort).
    """

    def __init__(self, again: Callable[[], None]) -> None:
        self.asked = asyncio.Event()
        self.at: float | None = None
        self._again = again

    def signal_received(self, sig: signal.Signals) -> None:
        if self.asked.is_set():
            self._again()
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


