"""An asyncio event loop on a virtual clock, for simulations of timer-driven code.

:class:`VirtualTimeLoop` runs ordinary coroutines (``asyncio.sleep``,
``asyncio.timeout``, ``loop.call_later``...) but never waits: when nothing is ready it
jumps its clock to the next timer. An hour of heartbeats runs in the CPU time the
callbacks themselves take, and the same program gives the same interleaving every run.

It has no I/O: its selector has nothing to watch, and a loop left with neither ready
callbacks nor timers is a deadlock, reported as an error instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Coroutine, Generator, Mapping
from typing import Any, TypeVar

from conveyor.platform.errors import ConveyorError

T = TypeVar("T")

owner_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "virtual_process", default=None
)
"""The simulated process a task belongs to (inherited by the tasks it creates)."""


class _ClockSelector(selectors.BaseSelector):
    """A selector with nothing to select: a wait for ``timeout`` advances the clock."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise ConveyorError("virtual-time loop deadlocked: nothing ready, no timer set")
        self.loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual and advances only when all tasks wait.

    Tasks are tagged with the :data:`owner_var` of the context that created them, so a
    whole simulated process can be killed at once (:meth:`kill`), as SIGKILL would.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        selector = _ClockSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = start_s
        self._by_owner: dict[str, set[asyncio.Task[Any]]] = {}
        self._killed: set[str] = set()
        self.set_task_factory(self._make_task)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)

    def _make_task(
        self, loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any], **kwargs: Any,
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        context: contextvars.Context | None = kwargs.get("context")
        owner = owner_var.get() if context is None else context.get(owner_var)
        if owner in self._killed:
            task.cancel()  # a dead process starts nothing (cleanup code may try)
        elif owner is not None:
            tasks = self._by_owner.setdefault(owner, set())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return task

    def kill(self, owner: str) -> int:
        """Cancel every live task of ``owner``; how many there were."""
        self._killed.add(owner)
        tasks = self._by_owner.pop(owner, set())
        for task in tasks:
            task.cancel()
        return len(tasks)


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        close_loop(loop)


def close_loop(loop: VirtualTimeLoop) -> None:
    """Cancel the tasks ``loop`` still holds, let them end, then close it (as
    ``asyncio.run`` does). A run ended early (Ctrl-C) left a simulated daemon's every
    task pending: closed with them, the loop logged "Task was destroyed but it is
    pending!" for each, thousands of lines after the command's one; the task that
    was running when Ctrl-C came holds the ``KeyboardInterrupt``, which the caller has
    (it is not logged again, as "Task exception was never retrieved")."""
    loop.set_exception_handler(_unless_interrupt)
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    finally:
        loop.close()


def _unless_interrupt(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if not isinstance(context.get("exception"), KeyboardInterrupt):
        loop.default_exception_handler(context)
