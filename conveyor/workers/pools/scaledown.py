"""PID-controlled scale-down of a stateless-worker pool.

Scale-up is rule-based and lives in the pool (reuse an idle worker, else create one up
to the maximum, else queue on the worker with the fewest waiting messages). This module
decides only *when to remove one idle worker*. It is pure logic with an explicit clock,
so the lab simulation and the real pool drive the very same object.

Every inspection period the pool calls :meth:`ScaleDownController.inspect` with the
average *waiting count* of its workers (messages assigned to a worker and not finished,
the one in progress included) and the number of idle workers. The target waiting count
is zero, so the error is ``-avg_waiting`` (never positive) and the PID signal is
negative whenever there is load now or there was load that has not been "paid back" by
removals. The loop follows the reference pseudo-code:

1. The PID is updated on *every* inspection, back-off or not (the integral keeps
   accumulating while we wait).
2. While less than ``backoff_s`` has passed since the last removal nothing else happens
   (the dead-zone counter is neither advanced nor reset).
3. Otherwise a negative signal advances the dead-zone counter and a non-negative one
   resets it. When the counter reaches ``dead_zone_cycles`` the counter is reset and,
   if at least one worker is idle, the pool is told to remove one; the integral is then
   scaled by ``(n-1)/n`` for ``n`` idle workers (anti-windup: removing one of ``n``
   surplus workers discharges ``1/n`` of the accumulated "too many workers" evidence;
   removing the last idle one discharges all of it).

4. Not in the reference: when the PID path removes nothing and the longest-idle worker
   has been idle ``idle_keepalive_s`` (the pool says how long), that worker is removed
   anyway, within the same back-off. Load that comes and goes between two inspections
   never makes the signal negative, and its workers would otherwise stay for ever.

Time passed to the PID is measured in *inspection periods*, not seconds: the shipped
gains (Kp=0.433, Ki=0.468, Kd=0.480) were tuned by the reference for a loop whose
integral adds one error per inspection and whose derivative is the difference of two
consecutive errors. With ``dt = elapsed / inspection_period_s`` a loop that ticks on time
uses exactly those sums, and a late tick is weighted by how late it is.
"""

from __future__ import annotations

import math

from conveyor.platform.balancing.pid import PIDController
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.options import ScaleDownPolicy

__all__ = ["ScaleDownController", "ScaleDownPolicy"]


class ScaleDownController:
    """Decides, once per inspection, whether the pool should drop one idle worker.

    Contract for callers: call :meth:`inspect` about every ``inspection_period_s`` with a
    non-decreasing clock (any monotonic seconds, e.g. ``time.monotonic()`` or simulated
    time). When it returns ``True`` the back-off and anti-windup have *already* been
    applied; the caller must remove one idle worker. If by then no worker is idle (a
    race in a concurrent pool), skipping the removal costs one back-off period, nothing
    more.
    """

    __slots__ = ("_below_zero", "_last_inspection_s", "_last_removal_s", "_pid", "policy")

    def __init__(self, policy: ScaleDownPolicy | None = None) -> None:
        self.policy = policy if policy is not None else ScaleDownPolicy()
        self._pid = PIDController(self.policy.kp, self.policy.ki, self.policy.kd)
        self._below_zero = 0
        self._last_inspection_s: float | None = None
        self._last_removal_s: float | None = None

    @property
    def pid(self) -> PIDController:
        return self._pid

    @property
    def signal(self) -> float:
        """The control signal computed at the last inspection."""
        return self._pid.last_output

    @property
    def negative_cycles(self) -> int:
        """Consecutive negative inspections counted towards the dead zone."""
        return self._below_zero

    def inspect(self, now_s: float, avg_waiting: float, idle_workers: int,
                idle_for_s: float = 0.0) -> bool:
        """Run one inspection; return whether to remove one idle worker now.

        ``idle_for_s`` is how long the longest-idle worker has been idle: past the
        policy's ``idle_keepalive_s`` a worker is removed even when the loop's signal
        never went negative (remove that longest-idle one, then).
        """
        if avg_waiting < 0 or not math.isfinite(avg_waiting):
            raise InvalidArgumentError(f"avg_waiting must be finite and >= 0, got {avg_waiting!r}")
        if idle_workers < 0:
            raise InvalidArgumentError(f"idle_workers must be >= 0, got {idle_workers!r}")
        period = self.policy.inspection_period_s
        if self._last_inspection_s is None:
            dt_cycles = 1.0
        else:
            elapsed = now_s - self._last_inspection_s
            if elapsed <= 0:
                raise InvalidArgumentError(
                    f"inspections must move forward in time: {now_s!r} after "
                    f"{self._last_inspection_s!r}"
                )
            dt_cycles = elapsed / period
        self._last_inspection_s = now_s
        signal = self._pid.update(-avg_waiting, dt_cycles)

        last_removal = self._last_removal_s
        # A microsecond of slack: inspections a period apart must not be held back by
        # float error (0.7 - 0.2 computes as 0.49999999999999994).
        if last_removal is not None and now_s - last_removal < self.policy.backoff_s - 1e-6:
            return False
        if self._signal_removes(signal, idle_workers):
            self._pid.scale_integral((idle_workers - 1) / idle_workers)
        elif not (idle_workers and 0 < self.policy.idle_keepalive_s <= idle_for_s + 1e-6):
            return False
        self._last_removal_s = now_s
        return True

    def _signal_removes(self, signal: float, idle_workers: int) -> bool:
        """The PID path: a negative signal for ``dead_zone_cycles`` inspections."""
        if signal >= 0:
            self._below_zero = 0
            return False
        self._below_zero += 1
        if self._below_zero < self.policy.dead_zone_cycles:
            return False
        self._below_zero = 0
        return idle_workers > 0

    def reset(self) -> None:
        """Forget history (e.g. when the pool was emptied or reconfigured)."""
        self._pid.reset()
        self._below_zero = 0
        self._last_inspection_s = None
        self._last_removal_s = None
