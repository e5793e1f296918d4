"""One back-off rule for every retry loop in Conveyor: capped, jittered, exponential.

The wait after the ``n``-th consecutive failure (``n`` = 1, 2, ...) is
``min(cap_s, first_s * multiplier ** (n - 1) + uniform(0, jitter_s))`` — the rule of
tenacity's ``wait_exponential_jitter``. Callers that retry through tenacity take
:meth:`Backoff.tenacity_wait`, which asks :meth:`Backoff.delay` itself, so the rule is
written once (and does not depend on which of tenacity's keyword names a version takes).
Jitter spreads the retries of many daemons that lost the same server at the same moment.

Who uses which numbers (first delay, cap, jitter):

* :data:`BROKER_WRITE` — a write the daemon cannot skip: the agent's acknowledgements
  and the dead-letter store (0.05 s doubling to 5 s, up to 0.25 s of jitter);
* Redis calls (the Redis adapter's ``Caller``, in its ``errors`` module): 0.05 s doubling
  to ``[redis] retry_max_delay_s``, jitter a quarter of that;
* Kafka outages (the Kafka adapter's ``retrying``, in its ``connection`` module: topic
  preparation, the ``kafka-group`` join): 0.1 s doubling to 5 s, jitter 1.25 s;
* a queue whose start failed (:class:`~conveyor.platform.balancing.balancer.DynamicBalancer`):
  ``rebalance_interval_s`` doubling to ``lease_ttl_s``, no jitter;
* a user-written slot supplier's ``reserve_slot`` that raised
  (:class:`~conveyor.workers.slots.wrappers.GuardedSlotSupplier`): 0.01 s doubling to
  ``max_backoff_s`` (1 s), no jitter;
* a failing handler (:class:`~conveyor.platform.options.RetryPolicy`): the handler's
  ``retry_*`` options; its jitter is added after the cap, as documented for users.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from tenacity import RetryCallState
from tenacity.wait import wait_base

from conveyor.platform.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float = 0.05
    multiplier: float = 2.0
    cap_s: float = 5.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value, low in (("first_s", self.first_s, 0.0), ("cap_s", self.cap_s, 0.0),
                                 ("jitter_s", self.jitter_s, 0.0),
                                 ("multiplier", self.multiplier, 1.0)):
            if not value >= low:  # also refuses NaN
                raise InvalidArgumentError(f"Backoff.{name} must be >= {low:g}, got {value!r}")

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (1 for the first; 0 counts as 1).

        Constant time for any count: past the cap the power is not computed further.
        """
        try:
            base = self.first_s * self.multiplier ** (max(failures, 1) - 1)
        except OverflowError:  # float ** int: a count past ~1000 doublings
            base = self.cap_s if self.first_s > 0 else 0.0
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
        return _TenacityWait(self)


class _TenacityWait(wait_base):
    """tenacity's ``wait`` protocol over :meth:`Backoff.delay` (attempt n failed: delay(n))."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.backoff.delay(retry_state.attempt_number)


BROKER_WRITE = Backoff(first_s=0.05, multiplier=2.0, cap_s=5.0, jitter_s=0.25)
"""For a write to the broker that must happen before the daemon goes on: acknowledgements
and dead letters (nothing is acked before its dead letter is stored)."""
