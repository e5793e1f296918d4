"""The keeper: a thread with an event loop of its own, where a daemon's liveness work runs
(lease renewals, membership heartbeats), so that a handler blocking the daemon's event
loop does not stop them.

What runs here must use clients of its own (a connection pool is bound to the loop that
opened it): the balancer builds a second pair of coordination stores for the keeper.
Results cross back to the daemon's loop with ``call_soon_threadsafe`` /
``run_coroutine_threadsafe`` and are never waited for from this side, so a blocked daemon
loop never blocks the keeper.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Keeper:
    def __init__(self, name: str = "conveyor-keeper") -> None:
        self._name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        self.loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=self._name,
                                        daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the keeper's loop; its future can be cancelled from any thread."""
        assert self.loop is not None, "keeper not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the keeper's loop and wait for it from the caller's loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the loop (after what was submitted has been cancelled or has ended)."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()
        self._thread = None
        self.loop = None
