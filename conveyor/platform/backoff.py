"""One back-off rule for every retry loop in Conveyor: capped, jittered, exponential.

The wait after the ``n``-th consecutive failure (``n`` = 1, 2, ...) is
``min(cap_s, first_s * multiplier ** (n - 1) + uniform(0, jitter_s))`` — tenacity's
``wait_exponential_jitter``, which :meth:`Backoff.tenacity_wait` returns for callers
that retry through tenacity. Jitter spreads the retries of many
daemons that lost the same server at the same moment.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from tenacity.wait import wait_base, wait_exponential_jitter


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float = 0.05
    multiplier: float = 2.0
    cap_s: float = 5.0
    jitter_s: float = 0.0

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (1 for the first)."""
        exponent = max(failures, 1) - 1
        # Past the cap the power only grows: stop computing it (no float overflow).
        base = self.first_s
        for _ in range(exponent):
            base *= self.multiplier
            if base >= self.cap_s:
                break
        if self.jitter_s > 0:
            base += random.uniform(0, self.jitter_s)
        return min(base, self.cap_s)

    async def sleep(self, failures: int) -> float:
        """Sleep :meth:`delay` ``(failures)``; returns how long that was."""
        delay = self.delay(failures)
        await asyncio.sleep(delay)
        return delay

    def tenacity_wait(self) -> wait_base:
        """The same rule for a tenacity ``AsyncRetrying(wait=...)``."""
        return wait_exponential_jitter(
            initial=self.first_s, max=self.cap_s, exp_base=self.multiplier, jitter=self.jitter_s
        )
