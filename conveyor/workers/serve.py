"""Run one worker daemon in a process until it is told to stop: ``conveyor worker`` and
the children of ``conveyor worker --processes`` both do it through :func:`serve`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from conveyor.platform.errors import ConveyorError
from conveyor.workers.daemon import DrainReport, WorkerDaemon

log = logging.getLogger("conveyor.daemon")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def serve(
    daemon: WorkerDaemon,
    *,
    ready: Callable[[], None] | None = None,
    commands: Callable[[], Awaitable[None]] | None = None,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    freeze_heap: bool = True,
) -> DrainReport:
    """Start ``daemon``, wait to be told to stop, stop it; return what the stop did.

    1. Handlers for ``signals`` are installed (before the start: a signal during it
       stops the daemon as soon as it has started) and stay until the stop is done.
    2. The daemon starts; with ``freeze_heap`` what was built so far is exempted from
       later GC passes (:func:`freeze_startup_heap`, for a process that exists to run
       this daemon); ``ready()`` is called.
    3. It runs until a signal arrives, ``commands()`` (run once ready, e.g. a
       supervisor's command stream) returns, or the daemon fails
       (:attr:`WorkerDaemon.failed`). ``commands`` still running then is cancelled and
       awaited, so it may finish what it had begun.
    4. The daemon stops (:meth:`WorkerDaemon.stop`: drains). A failure is then raised
       (as a :class:`ConveyorError`); otherwise the :class:`DrainReport` is returned.
    """
    stop = _StopRequest()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.signal_received, sig)
    try:
        await daemon.start()
        if freeze_heap:
            freeze_startup_heap()
        if ready is not None:
            ready()
        await _until_stop(daemon, stop, commands)
        report = await daemon.stop()  # the one place a served daemon is stopped
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    failure = daemon.failure
    if failure is not None:  # it can never own a queue: stopped, now say why
        if isinstance(failure, ConveyorError):
            raise failure
        raise ConveyorError(f"the daemon failed: {failure}") from failure
    return report


class _StopRequest:
    """Where a stop signal is received: the one place to change what a signal means."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    def signal_received(self, sig: signal.Signals) -> None:
        if not self.asked.is_set():
            log.info("%s received: draining", sig.name)
        self.asked.set()


async def _until_stop(
    daemon: WorkerDaemon, stop: _StopRequest, commands: Callable[[], Awaitable[None]] | None
) -> None:
    """Wait for a signal, the daemon's failure or ``commands`` returning; then cancel
    ``commands`` if it is still running and wait for it to finish. ``commands`` failing
    is logged and stops the daemon like its return."""
    waits: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(stop.asked.wait()), asyncio.ensure_future(daemon.failed.wait())
    ]
    if commands is not None:
        waits.append(asyncio.ensure_future(commands()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
        for waiting in waits:
            try:
                await waiting
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("the daemon's commands failed: stopping")


def freeze_startup_heap() -> None:
    """Exempt what a worker process built at startup from later full GC passes.

    For processes that exist to run one daemon (``conveyor worker`` and its supervised
    children), called once the daemon has started: modules, the app, config and
    connections live as long as the process, yet every full collection re-scanned them
    (~10 ms per pass for a ~25k-object heap on a 2-core VM, a pass every ~20k messages
    under load). ``gc.collect()`` first, so nothing already garbage is kept.
    """
    gc.collect()
    gc.freeze()
