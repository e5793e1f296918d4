"""The loop watchdog: notices a handler that blocks the event loop, names it, and tells
the parts that must not wait on the loop how long it has been blocked.

An ``async def`` handler that calls blocking code (``time.sleep``, a synchronous HTTP or
database client, a long CPU-bound loop) stops every coroutine of its daemon: pulls, acks,
other handlers — and, unless they run elsewhere, the lease renewals and heartbeats that
keep the daemon's queues its own. The watchdog is a thread that posts a probe to the loop
every ``probe_interval_s`` (``loop.call_soon_threadsafe``) and measures how long the probe
waits. Its reading does not depend on the loop:

* :meth:`LoopWatchdog.stall_s` — how long the loop has not answered (0 while healthy).
  The balancer's keeper thread renews leases only while this stays below the lease's
  tolerance, so a stall shorter than the lease (by its margin) costs no queue, and a longer
  one gives the queues up (their messages go to another daemon, each such delivery
  counted against the message: see ``max_deliveries``).
* :attr:`LoopWatchdog.stalled` — set once a stall passes ``threshold_s``, cleared when the
  probe gets through.
* :attr:`LoopWatchdog.resume_at` — infinite while :attr:`~LoopWatchdog.stalled` is set,
  then when the probe got through plus :data:`STALL_BREATH_S`. A pulling agent's runner
  compares it with the clock after each handler call and starts no message before it
  (nor before :data:`STALL_BREATH_TURNS` turns of the loop after its wait): blockers that
  follow one another are then separate stalls, each measured on its own, not one long
  one; and what a stall held up (a Kafka group's heartbeat, due during it) runs before
  the next blocker, however the runner waited meanwhile. (A runner whose own wait ran
  out inside another queue's stall woke first after it and started its blocker at once:
  two 3 s blockers left 6.01 s between a group's heartbeats, past its 6 s session.)
* :func:`stall_note` — for a broker error's log line: a call whose deadline passed while
  the loop was blocked fails as a timeout when it resumes (asyncio runs the timeout
  before the task that would read the answer waiting in the socket), so "unreachable"
  right after a stall says so. (Redis calls put such a deadline off instead:
  :mod:`conveyor.platform.deadlines`.)
* A stall past ``threshold_s`` is logged once it ends — the handler, the message, the queue,
  how long, and the blocking frame's stack as seen while it blocked — at most once per
  handler per ``log_interval_s`` (the others are counted in :attr:`stalls`).
* A stall of the whole process — a thread holding the GIL in C code that keeps it (a
  ``def`` handler's long regex match, a huge sort or parse), the process stopped, or
  starved of CPU (a container's CPU quota spent) —
  holds the watchdog's thread too, so it cannot see it while it lasts: it finds it when
  it wakes that late, and counts and logs it as such. Which thread held it is not known
  by then (it ran on a few milliseconds before letting the others run: long enough to
  finish a handler call). The lease renewals' thread was held as well: such a stall
  costs the queues as a blocked loop does.

Reading the blocked thread's frames from the watchdog thread is what a debugger does: the
stack is taken with the GIL held, so it is consistent, and it costs nothing while the loop
is healthy.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any

from conveyor.platform.terminal import Lines

log = logging.getLogger("conveyor.watchdog")

STACK_FRAMES = 8
"""Innermost frames of the blocking stack shown in the log line."""

STALL_NOTE_WITHIN_S = 1.0
"""How soon after a stall a broker error's log line names it (:func:`stall_note`)."""

STALL_BREATH_S = 0.01
"""How long after a stall (the probe answered) the loop runs before the next handler
starts: the stall's replies are read and the timers it held up fire."""

STALL_BREATH_TURNS = 8
"""And how many turns of the loop a runner lets pass after that time before it starts
one. A heartbeat whose answer came during the stall is sent in the fifth turn from the
one that reads the socket (aiokafka 0.14: the read; the connection's reader; the
request's ``wait_for``; the heartbeat task, which answers and sleeps 0; the next
request), and a runner whose wait is over wakes in that first turn at the earliest.
10 ms cover those turns unless the process is descheduled meanwhile; the turns cover
them anyway, with some to spare."""

_last_stall = (-float("inf"), 0.0)
"""When (``time.monotonic()``) the last stall past a watchdog's threshold ended in this
process, and how long it lasted."""


def stall_note(within_s: float = STALL_NOTE_WITHIN_S) -> str:
    """A note for the log line of a broker call that failed: empty, or, when an event
    loop's stall ended less than ``within_s`` ago, that the failure may be the stall's.
    A read or connect whose deadline passed during the stall times out as the loop
    resumes, its answer maybe already waiting, so the broker is not necessarily down."""
    ended, lasted_s = _last_stall
    if time.monotonic() - ended > within_s:
        return ""
    return (f" — just after the event loop was blocked {lasted_s:.1f}s: a timeout then "
            f"is likely the stall's, not the broker's")


@dataclass(frozen=True, slots=True)
class Culprit:
    """What the loop was running when it was seen blocked."""

    handler: str
    message_id: str
    queue: int
    stream: str
    stack: str


class LoopWatchdog:
    def __init__(self, threshold_s: float = 0.5, log_interval_s: float = 60.0,
                 probe_interval_s: float = 0.1) -> None:
        self.threshold_s = threshold_s
        self.log_interval_s = log_interval_s
        self.probe_interval_s = min(probe_interval_s, threshold_s / 2)
        self.stalled = False
        """Set (by the watchdog thread) while a stall past ``threshold_s`` lasts."""
        self.resume_at = -math.inf
        """``time.monotonic()`` before which no handler should start: +inf while
        :attr:`stalled` is set, then the stall's end (its probe answered) plus
        :data:`STALL_BREATH_S`. One float, so a runner's check is one comparison."""
        self._flagging = threading.Lock()
        """Held while :attr:`stalled` and :attr:`resume_at` change (this thread sets them,
        the loop clears them): an answer between the two writes would leave the loop
        "stalled" until the next stall."""
        self.stalls = 0
        """Stalls past ``threshold_s`` seen so far (the ``conveyor_loop_stalls`` count)."""
        self.longest_s = 0.0
        """The longest stall seen so far."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._posted_at: float | None = None
        self._culprit: Culprit | None = None
        self._held_s = 0.0
        """How late this watchdog's thread woke last, when it was held too (0: not)."""
        self._logged: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Watch the running loop (call from it)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="conveyor-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    # -- readings ----------------------------------------------------------------------
    @property
    def culprit(self) -> Culprit | None:
        """What the loop was running when the stall under way was seen (None if none)."""
        return self._culprit if self.stalled else None

    def stall_s(self) -> float:
        """How long the loop has left the current probe unanswered (0: it answers)."""
        posted = self._posted_at
        if posted is None:
            return 0.0
        late = time.monotonic() - posted - self.probe_interval_s
        return late if late > 0 else 0.0

    # -- the thread --------------------------------------------------------------------
    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        due = time.monotonic() + self.probe_interval_s
        while not self._stop.wait(self.probe_interval_s):
            now = time.monotonic()
            if now - due >= self.threshold_s:
                # This thread was held too, not the loop alone: the whole process was.
                self._held_s = now - due
                self._flag_stalled()
                if self._posted_at is None:  # a probe now, to report it from the loop
                    self._posted_at = now  # (not back-dated: the loop answers again, so
                    try:                   # the leases may be renewed if still valid)
                        loop.call_soon_threadsafe(self._answer, now)
                    except RuntimeError:  # the loop is closed
                        return
            due = now + self.probe_interval_s
            if self._posted_at is None:
                self._posted_at = time.monotonic()
                try:
                    loop.call_soon_threadsafe(self._answer, self._posted_at)
                except RuntimeError:  # the loop is closed
                    return
                continue
            if not self.stalled and self.stall_s() >= self.threshold_s:
                self._culprit = self._find_culprit()
                self._flag_stalled()

    def _flag_stalled(self) -> None:
        with self._flagging:
            self.stalled = True
            self.resume_at = math.inf

    def _answer(self, posted_at: float) -> None:
        """The probe got through (runs on the loop)."""
        if self._posted_at != posted_at:
            return
        answered = time.monotonic()
        took_s = answered - posted_at
        self._posted_at = None
        with self._flagging:
            if not self.stalled:
                return
            self.stalled = False
            self.resume_at = answered + STALL_BREATH_S
        held_s, self._held_s = self._held_s, 0.0
        took_s = max(took_s, held_s)
        self.stalls += 1
        self.longest_s = max(self.longest_s, took_s)
        global _last_stall
        _last_stall = (time.monotonic(), took_s)
        culprit, self._culprit = self._culprit, None
        if held_s:
            self._report_held(took_s)
        else:
            self._report(took_s, culprit)

    def _report_held(self, took_s: float) -> None:
        if not self._may_log("held"):
            return
        log.warning(
            "the whole process was held for %.1fs, this watchdog's thread too: a thread "
            "held the GIL — a `def` handler in C code that does not release it (a long "
            "regex match, sorting or parsing a huge object, a C extension) — or the "
            "process was stopped or starved of CPU (a container's CPU limit); lease "
            "renewals and heartbeats were held as well. Split such work, or run it in a "
            "subprocess; these stalls are not logged again for %.0fs.",
            took_s, self.log_interval_s)

    def _may_log(self, who: str) -> bool:
        now = time.monotonic()
        if now - self._logged.get(who, -self.log_interval_s) < self.log_interval_s:
            return False
        self._logged[who] = now
        return True

    def _report(self, took_s: float, culprit: Culprit | None) -> None:
        who = culprit.handler if culprit is not None else "?"
        if not self._may_log(who):
            return
        if culprit is None:
            log.warning("the event loop was blocked for %.1fs (no handler was running: "
                        "blocking code elsewhere, or a long garbage collection)", took_s)
            return
        log.warning(
            "handler %s blocked the event loop for %.1fs (queue %d, message %s, stream "
            "%s): use `def` for blocking code (it runs on a thread) or an async client; "
            "this handler's next stalls are not logged for %.0fs. It was blocked at:\n%s",
            culprit.handler, took_s, culprit.queue, culprit.message_id, culprit.stream,
            self.log_interval_s, Lines(culprit.stack),
        )

    def _find_culprit(self) -> Culprit | None:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return None
        stack = "".join(traceback.format_stack(frame, limit=STACK_FRAMES)).rstrip()
        probe: FrameType | None = frame
        while probe is not None:
            if probe.f_code.co_name == "_runner" and "route" in probe.f_code.co_varnames:
                found = _runner_culprit(probe, stack)
                if found is not None:
                    return found
            probe = probe.f_back
        return Culprit("?", "?", -1, "?", stack)


def _runner_culprit(frame: FrameType, stack: str) -> Culprit | None:
    """The handler and message a pulling agent's runner frame is running."""
    local = frame.f_locals
    route: Any = local.get("route")
    msg: Any = local.get("msg")
    queue: Any = local.get("queue")
    try:
        return Culprit(route.handler.name, str(msg.id), int(queue),
                       f"{msg.stream.namespace}/{msg.stream.key}", stack)
    except (AttributeError, TypeError, ValueError):
        return None
