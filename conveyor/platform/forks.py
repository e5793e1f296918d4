"""A worker's forked copy ends as soon as it goes back into the worker.

A handler that calls ``os.fork()`` copies the whole worker process: its event loop with
every task on it (pulls, runners, acknowledgements, lease renewals), its broker
connections (the same sockets as its parent's) and its buffers — but none of its other
threads. A forked process that does not end with ``os._exit()`` (or an ``exec``) before
its handler's call returns would go on as a second worker on its parent's connections:
pulling, handling and acknowledging its parent's messages, forking again, and left as
an orphan once the worker stops.

So while a daemon runs, a process forked from it is marked as a *copy*
(:func:`_forked`, an at-fork hook), and a copy ends itself — :func:`end_copy`: one line
on stderr, then ``os._exit(COPY_STATUS)`` — the moment control comes back to the
worker's code:

* its handler's call returns or raises: the places that await a handler call, and the
  handler threads (:mod:`conveyor.workers.threads`), test :data:`copied` right after;
* forked on the event loop's thread (an ``async def`` handler), its handler awaits
  something: the loop's next callback is the end, run before any other task's (none of
  the copy's tasks runs again);
* forked on another thread (a plain ``def`` handler, ``asyncio.to_thread``), the call
  returns into a thread pool, which hands the result to the loop: that hand-over
  (``call_soon_threadsafe``) is the end.

It acknowledges nothing, publishes nothing, flushes no buffer and sends nothing on the
parent's connections: its parent still holds the message, and the parent's own run of
the handler decides what becomes of it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import weakref
from typing import Any, NoReturn

COPY_STATUS = 70
"""The exit status of a copy that ended itself: ``EX_SOFTWARE``, an error in the program
(its handler forked and did not end the forked process)."""

copied = False
"""True in a process forked from a running daemon's: a copy of a worker, which must end
the moment control comes back to the worker's code (see the module)."""

_daemons: weakref.WeakKeyDictionary[object, tuple[asyncio.AbstractEventLoop, int]] = (
    weakref.WeakKeyDictionary())
"""The daemons running in this process (:func:`guard`): the loop each runs on and that
loop's thread."""
_pid = 0
"""The process that :data:`_daemons` run in."""
_hooked = False


def guard(daemon: object, loop: asyncio.AbstractEventLoop) -> None:
    """From now on, a process forked from this one is a copy: ``daemon`` starts, on
    ``loop`` (called from the loop's thread); until :func:`release` or its collection."""
    global _hooked, _pid, copied
    if not _hooked:
        os.register_at_fork(after_in_child=_forked)
        _hooked = True
    if _pid != os.getpid():  # a process of its own (a multiprocessing child), not a copy
        _daemons.clear()
        _pid = os.getpid()
        copied = False
    _daemons[daemon] = (loop, threading.get_ident())


def release(daemon: object) -> None:
    """``daemon`` has stopped (or failed to start)."""
    _daemons.pop(daemon, None)


def end_copy(*_: Any, **__: Any) -> NoReturn:
    """End this process, a copy of a worker, at once: one line on stderr, then
    ``os._exit(COPY_STATUS)`` — no ``atexit``, no buffer flushed, nothing sent."""
    line = (f"conveyor: error: process {os.getpid()}, forked from worker process {_pid} "
            "by a handler (os.fork), came back into the worker instead of ending with "
            f"os._exit(): it exits now with status {COPY_STATUS}, having touched none of "
            "the worker's messages or connections\n")
    with contextlib.suppress(OSError):
        os.write(2, line.encode())
    os._exit(COPY_STATUS)


def _forked() -> None:
    """In a process just forked: a copy if a daemon ran in its parent (see the module)."""
    global copied
    if not _daemons or _pid == os.getpid():
        return
    copied = True
    here = threading.get_ident()
    for loop, thread in set(_daemons.values()):
        if thread != here:  # that loop's thread is gone: a result handed to it ends this
            setattr(loop, "call_soon_threadsafe", end_copy)  # noqa: B010 (mypy: a method)
            continue
        # Before every callback the loop had already queued (another task's step would
        # acknowledge, pull...): first at the loop's next turn. ``_ready`` is the loop's
        # queue of callbacks in CPython's asyncio; anywhere else, the end is queued last.
        ready = getattr(loop, "_ready", None)
        if isinstance(ready, collections.deque):
            ready.appendleft(asyncio.Handle(end_copy, (), loop))
        else:
            loop.call_soon(end_copy)
