"""Fencing, from the agent's side: is this queue this daemon's now?

The balancer knows until when (monotonic clock) a queue is this daemon's: the lease's
local deadline less its safety margin, or, for a Kafka group, the last heartbeat plus the
session timeout. :class:`Ownership` caches that deadline and asks again only once it has
passed, so the check before every handler start, pull and acknowledgement is one clock
read and no I/O. A daemon paused past its lease (SIGSTOP, a long GC, a stalled VM)
therefore starts, pulls and acknowledges nothing once it resumes, until the lease is
renewed or the queue is declared lost.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class Ownership:
    __slots__ = ("_ask", "poll_s", "until")

    def __init__(self, owned_until: Callable[[], float] | None, poll_s: float) -> None:
        self._ask = owned_until or (lambda: math.inf)
        self.until = self._ask()
        """The cached deadline: before it, the queue is ours without asking."""
        self.poll_s = poll_s

    def may_act(self) -> bool:
        now = time.monotonic()
        if now < self.until:
            return True
        self.until = self._ask()
        return now < self.until

    async def wait(self, stopping: Callable[[], bool]) -> bool:
        """Until the queue is ours again (True) or ``stopping()`` (False).

        Polled every ``poll_s``: a renewal moves a deadline, it sets no event; a queue
        declared lost instead is aborted, which cancels the wait.
        """
        while not stopping() and not self.may_act():  # noqa: ASYNC110 - see above
            await asyncio.sleep(self.poll_s)
        return not stopping()
