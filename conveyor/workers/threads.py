"""Handler threads: where plain ``def`` handlers run, bounded by the slots their calls hold.

A plain-``def`` handler's chain (or batch step) hands each call to :meth:`HandlerThreads.run`
and awaits it, so the agent's runner holds the call's slot while the thread runs, as it
does for an ``async def`` call: the daemon's slot supplier bounds these calls like any.

**The bound.** A call goes to a thread only while fewer calls are on threads than
``limit()``; the daemon passes its supplier's ``issued`` (slots out right now), read at
every hand-over, so the bound follows a fixed supplier, a resource-based one issuing more
or fewer, and a user-written one alike, with nothing to configure. Ordinarily it holds
nothing back — every call on a thread has a slot of its own. It bites after a call was
*abandoned* (its awaiter cancelled: a drain that timed out, a cell job timeout): a thread
cannot be interrupted, so the abandoned call runs on and keeps its place, and new calls
wait for it (in :attr:`HandlerThreads.held`) instead of piling more threads up.

Threads are started when a call is handed over and no idle thread waits, and end after
``idle_s`` without work: the count follows the calls that ran at once lately, never more
than the slots out when they were handed over. They are daemon threads, and
:meth:`HandlerThreads.close` (daemon stop, after the drain) waits for none of them: a call
still running then is abandoned — its message was not acknowledged and is redelivered —
and cannot keep the process from exiting.

Each call runs in a copy of the awaiting task's ``contextvars`` context
(:func:`contextvars.copy_context`, as :func:`asyncio.to_thread`), so the current
OpenTelemetry span is the parent of whatever the handler traces.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from conveyor.platform import forks
from conveyor.platform.delivery.chain import base_exception_failure
from conveyor.platform.errors import HandlerDeclarationError, ShutdownError

log = logging.getLogger("conveyor.threads")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context,
              Callable[..., Any], tuple[Any, ...]]


class HandlerThreads:
    """Runs ``fn(*args)`` on threads, at most ``limit()`` calls at once (see the module).

    :meth:`run` is called on the event loop and returns a future of the call's result or
    exception. Cancelling it before a thread has taken the call skips the call; after,
    abandons it (it runs on, its result is dropped, it counts against the limit until it
    returns).
    """

    def __init__(self, limit: Callable[[], int], *, idle_s: float = 10.0,
                 name: str = "conveyor-handler") -> None:
        self._limit = limit
        self.idle_s = idle_s
        self._name = name
        self._serial = itertools.count(1)
        # Thread side, under _lock: calls handed over and not yet taken, thread counts.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._work: deque[_Call] = deque()
        self._idle = 0
        self._threads = 0
        self._closed = False
        # Loop side.
        self.held: deque[_Call] = deque()
        """Calls waiting for the limit (only while abandoned calls still run)."""
        self.running = 0
        """Calls handed to threads and not returned, abandoned ones included."""
        self.peak_running = 0
        self.peak_threads = 0

    @property
    def threads(self) -> int:
        """Threads alive, idle ones included."""
        return self._threads

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` on a thread, in a copy of the current context."""
        if self._closed:
            raise ShutdownError("the handler threads are closed (the daemon stopped)")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call: _Call = (loop, future, contextvars.copy_context(), fn, args)
        if self.held or self.running >= self._limit():
            self.held.append(call)
            self._hand_held()
        else:
            self._hand(call)
        return future

    def close(self) -> None:
        """Let idle threads end and refuse new calls; waits for no thread."""
        with self._lock:
            self._closed = True
            self._work.clear()
            self._wake.notify_all()
        self.held.clear()
        if self.running:
            log.warning("%d plain-def handler call(s) still running on threads at stop: "
                        "abandoned (their messages were not acknowledged)", self.running)

    # -- loop side ------------------------------------------------------------------------
    def _hand(self, call: _Call) -> None:
        self.running += 1
        if self.running > self.peak_running:
            self.peak_running = self.running
        with self._lock:
            self._work.append(call)
            start = len(self._work) > self._idle  # more calls waiting than idle threads
            if start:
                self._threads += 1
                self.peak_threads = max(self.peak_threads, self._threads)
            else:
                self._wake.notify()
        if start:
            threading.Thread(target=self._serve, name=f"{self._name}-{next(self._serial)}",
                             daemon=True).start()

    def _hand_held(self) -> None:
        held = self.held
        while held and self.running < self._limit():
            call = held.popleft()
            if not call[1].cancelled():  # its awaiter gave up before it started: skip it
                self._hand(call)

    def _returned(self, future: asyncio.Future[Any], result: Any,
                  error: BaseException | None) -> None:
        self.running -= 1
        if not future.cancelled():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        if self.held:
            self._hand_held()

    # -- thread side ----------------------------------------------------------------------
    def _serve(self) -> None:
        lock, work, wake = self._lock, self._work, self._wake
        idle = False  # counted in self._idle
        while True:
            with lock:
                while not work:
                    if self._closed:
                        self._threads -= 1
                        self._idle -= idle
                        return
                    if not idle:
                        self._idle += 1
                        idle = True
                    if not wake.wait(self.idle_s) and not work:
                        self._threads -= 1
                        self._idle -= 1
                        return
                call = work.popleft()
                if idle:
                    self._idle -= 1
                    idle = False
            outcome = self._call(call)
            # Counted idle *before* the loop hears of the return: a call the loop hands
            # on meanwhile (a held one) then goes to this thread, not to a new one.
            with lock:
                self._idle += 1
                idle = True
            self._post_return(call, outcome)

    def _call(self, call: _Call) -> tuple[Any, BaseException | None]:
        """Run ``call``: its result, or what it raised."""
        _, future, context, fn, args = call
        result: Any = None
        error: BaseException | None = None
        if not future.cancelled():  # else: abandoned before it started, so never run
            try:
                result = context.run(fn, *args)
                if inspect.iscoroutine(result):
                    result.close()
                    raise HandlerDeclarationError(
                        f"{fn!r} returned a coroutine: declare it `async def`")
            except StopIteration as exc:  # a Future refuses it: as a coroutine's would be
                error = RuntimeError(f"{fn!r} raised StopIteration")
                error.__cause__ = exc
            except GeneratorExit as exc:
                # Set on the future, the awaiting task would throw it into its coroutine,
                # and Python then closes the coroutines that one awaits and raises it in
                # the outermost: the agent's runner, not the call, would end.
                error = base_exception_failure(exc)
                error.__cause__ = exc
            except BaseException as exc:  # handed to the awaiter, as asyncio.to_thread does
                error = exc
            if forks.copied:  # a process the call forked, back here: it ends (forks.py)
                forks.end_copy()
        return result, error

    def _post_return(self, call: _Call, outcome: tuple[Any, BaseException | None]) -> None:
        loop, future = call[0], call[1]
        result, error = outcome
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(self._returned, future, result, error)
