"""A deadline for a broker call that does not blame the broker for the event loop's stall.

``asyncio.timeout`` fires when its time comes, however late the loop gets there. A read
whose deadline passes while a handler blocks the loop (``time.sleep``, a synchronous
client) times out as the loop resumes, though its answer is usually already waiting in
the socket: in the loop's first pass after the stall the socket's reader callback runs
and schedules the reading task for the *next* pass, but the timeout's callback runs in
this one and cancels the task. The call then fails as if the broker had gone quiet, and
its connection is dropped and opened again.

:class:`StallTolerantTimeout` puts such a deadline off: when its callback runs more than
:data:`LATE_S` after the deadline (the loop was blocked when it came due), the deadline
becomes :data:`GRACE_S` from then, so the call fails only once the loop has run that
long without a stall and the answer has still not come. A broker that is really down is
found out at most ``GRACE_S`` after the stall that hid the deadline ends — or, on a loop
that keeps stalling, once the deadline has been put off :data:`MAX_PUT_OFFS` times.
A deadline whose callback runs less late (a stall that ended just after it, or none)
cancels the call one loop pass later, after the tasks the socket callbacks of that
pass woke: an answer already waiting is read, not cancelled.

Decisions: ``LATE_S`` is far above how late a timer fires on a busy but unblocked loop
(milliseconds) and below the loop watchdog's stall threshold (0.5 s); ``GRACE_S``
gives the loop many passes to read what is waiting.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, cast

LATE_S = 0.25
"""A deadline whose callback runs this much after it was due passed during a stall."""

GRACE_S = 0.25
"""How long the loop runs, after a stall that hid a deadline, before the call fails."""

MAX_PUT_OFFS = 4
"""How many stalls in a row may put one deadline off. A loop whose handlers block it
again and again (a stall, a few passes, a stall) would otherwise hide a broker that is
gone for as long as they do; after these, the call fails one pass after its deadline
(an answer already waiting is still read)."""


class StallTolerantTimeout:
    """``async with StallTolerantTimeout(delay_s):`` — ``asyncio.timeout(delay_s)``
    (the builtin ``TimeoutError`` when the deadline passes, as there; ``None``: no
    deadline), its deadline put off while the loop was blocked (module docstring). A
    cancellation from elsewhere is left a ``CancelledError``, as with ``asyncio.timeout``.
    Entered in a task (as ``asyncio.timeout``)."""

    __slots__ = ("_cancelling", "_delay_s", "_due", "_expired", "_handle", "_loop",
                 "_put_offs", "_task")

    def __init__(self, delay_s: float | None) -> None:
        self._delay_s = delay_s
        self._handle: asyncio.Handle | None = None
        self._expired = False
        self._due = 0.0
        self._cancelling = 0
        self._put_offs = 0
        self._task: asyncio.Task[Any]
        self._loop: asyncio.AbstractEventLoop

    async def __aenter__(self) -> StallTolerantTimeout:
        if self._delay_s is None:
            return self
        self._task = cast("asyncio.Task[Any]", asyncio.current_task())  # in a task
        self._cancelling = self._task.cancelling()
        self._expired = False  # a reused instance must not uncancel for its last use
        self._put_offs = 0
        self._loop = asyncio.get_running_loop()
        # Clamped: a deadline already past is due now, not a stall to put off.
        self._due = self._loop.time() + max(self._delay_s, 0.0)
        self._handle = self._loop.call_at(self._due, self._on_due)
        return self

    def _on_due(self) -> None:
        now = self._loop.time()
        if now - self._due > LATE_S and self._put_offs < MAX_PUT_OFFS:
            # the loop was blocked when the deadline came
            self._put_offs += 1
            self._due = now + GRACE_S
            self._handle = self._loop.call_at(self._due, self._on_due)
            return
        # Not cancelled in this pass: the socket callbacks of this pass (run before the
        # timers) may have just woken the task with its answer, which it reads in the
        # next pass; a stall that ended less than LATE_S after the deadline leaves
        # exactly that. Expire after those wake-ups instead.
        self._handle = self._loop.call_soon(self._expire)

    def _expire(self) -> None:
        self._handle = None
        self._expired = True
        self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._expired:  # as asyncio.timeout's exit does
            uncancelled = self._task.uncancel()
            if uncancelled <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        """Whether the deadline passed and cancelled the call."""
        return self._expired


class TaskDeadlines:
    """Deadlines for many calls on one timer, for a call too frequent for a timer of its
    own: a Kafka publish (a :class:`StallTolerantTimeout` costs about 3.4 us a call —
    its ``call_at`` and cancel, its two awaits — where the adapter's whole single
    publish took about 5).

    A call sets its task's deadline (:meth:`set`; :meth:`restart` moves it on progress)
    and clears it when it ends (:meth:`clear`). One timer, armed while any deadline is
    set, ticks every ``tick_s`` and cancels each task whose deadline has passed, so a
    call fails at most ``tick_s`` late. A tick that runs more than :data:`LATE_S` late
    (the loop was blocked) cancels nothing and ticks again :data:`GRACE_S` later, at
    most :data:`MAX_PUT_OFFS` times in a row, as :class:`StallTolerantTimeout` puts its
    deadline off. The call's ``CancelledError`` handler asks :meth:`expired` whether
    the deadline did it (the cancellation is then taken back, as ``asyncio.timeout``'s
    exit takes it back) or a cancellation from elsewhere. A task holds one deadline at
    a time."""

    __slots__ = ("_due", "_fired", "_handle", "_loop", "_next", "_put_offs", "_tick_s")

    def __init__(self, tick_s: float) -> None:
        self._tick_s = tick_s
        self._due: dict[asyncio.Task[Any], float] = {}
        self._fired: set[asyncio.Task[Any]] = set()
        """Tasks cancelled for their deadline, until their handler asks (:meth:`expired`)."""
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next = 0.0
        """When the armed tick is due."""
        self._put_offs = 0

    def set(self, task: asyncio.Task[Any], delay_s: float) -> None:
        """``task``'s deadline is ``delay_s`` from now."""
        loop = task.get_loop()
        self._due[task] = loop.time() + delay_s
        if self._handle is None or self._loop is not loop:  # another loop: a new timer
            if self._handle is not None:
                self._handle.cancel()
            self._loop = loop
            self._arm(self._tick_s)

    def restart(self, task: asyncio.Task[Any], delay_s: float) -> None:
        """Move ``task``'s deadline to ``delay_s`` from now, if it still has one (safe
        from a callback that runs after the call ended)."""
        if task in self._due and self._loop is not None:
            self._due[task] = self._loop.time() + delay_s

    def clear(self, task: asyncio.Task[Any]) -> None:
        self._due.pop(task, None)
        self._fired.discard(task)

    def expired(self, task: asyncio.Task[Any], cancelling: int) -> bool:
        """Whether the ``CancelledError`` ``task`` handles is its deadline's and no other
        cancellation came (``cancelling``: ``task.cancelling()`` when the deadline was
        set); the deadline's own is taken back either way."""
        if task not in self._fired:
            return False
        self._fired.discard(task)
        return task.uncancel() <= cancelling

    def _arm(self, delay_s: float) -> None:
        assert self._loop is not None
        self._next = self._loop.time() + delay_s
        self._handle = self._loop.call_at(self._next, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._handle = None
        if not self._due:
            return  # nothing watched: the next set arms a timer again
        now = self._loop.time()
        if now - self._next > LATE_S and self._put_offs < MAX_PUT_OFFS:
            self._put_offs += 1  # the loop was blocked: its answers may be waiting
            self._arm(GRACE_S)
            return
        self._put_offs = 0
        for task, due in list(self._due.items()):
            if due <= now and task not in self._fired:
                self._fired.add(task)
                task.cancel()
        self._arm(self._tick_s)
