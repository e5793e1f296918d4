"""The resource-based slot supplier: more slots while CPU and memory have room.

Every ``sample_period_s`` it samples CPU and memory (:mod:`conveyor.workers.resources`:
cgroup v2 inside a container, the host otherwise; *anonymous* memory, never the page
cache), smooths each with the cooperative dual-mode Kalman filter
(:class:`~conveyor.platform.balancing.kalman.CDMKalmanFilter`), and runs one PID controller per
resource on ``target - smoothed``. A slot beyond ``min_slots`` is issued only when both
controllers' outputs are above their thresholds, fewer than ``max_slots`` are out, and
``ramp_throttle_s`` has passed since the last one was issued (new work takes a moment
to show up in the samples).

What it does differently from Temporal's resource-based tuner, and why:

* **Anonymous memory, not ``memory.current``** — the page cache is reclaimable and
  made Temporal's supplier stop issuing slots for minutes (see ``resources.py``).
* **CDM-KF smoothing instead of raw samples** — the fast filter follows a rise at
  once, so a load spike stops issuing within one sample; the slow filter decays
  gently, so a momentary dip (a handler waiting on I/O) does not release a burst of
  slots that then all wake up together and overshoot.
* **No polling in ``reserve_slot``** — waiters are woken by a new sample or a released
  slot, not by a 10 ms poll loop, and handed slots in arrival order.
* **Deterministic by construction** — the sampler and the clock are injectable and
  :meth:`observe` is public, so its decisions can be tested from fed samples.
* **Ramp throttle honoured exactly** — a waiter held back only by the throttle is
  woken when it expires, not at the next sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from conveyor.platform.balancing.kalman import CDMKalmanFilter
from conveyor.platform.balancing.pid import PIDController
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.slots import (
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)
from conveyor.platform.tasks import cancel_and_wait
from conveyor.workers.resources import ResourceSample, ResourceSampler, default_sampler

log = logging.getLogger("conveyor.slots")


class ResourceBasedSlotSupplier(SlotSupplier):
    """Issues slots while smoothed CPU and memory stay below their targets.

    The PID gains and output thresholds default to Temporal's (P 5.0, I 0, D 1.0; a
    slot needs an output above 0.25 for memory and 0.05 for CPU): with P 5 and a
    threshold of 0.25, memory must be at least 5 points under target to grow, CPU at
    least 1 point.
    """

    def __init__(
        self,
        *,
        target_cpu: float = 0.8,
        target_memory: float = 0.8,
        min_slots: int = 1,
        max_slots: int = 10_000,
        ramp_throttle_s: float = 0.05,
        sample_period_s: float = 0.1,
        pid_gains: tuple[float, float, float] = (5.0, 0.0, 1.0),
        cpu_threshold: float = 0.05,
        memory_threshold: float = 0.25,
        sampler: ResourceSampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_in_background: bool = True,
    ) -> None:
        if not 1 <= min_slots <= max_slots:
            raise InvalidArgumentError(
                f"need 1 <= min_slots <= max_slots, got {min_slots}, {max_slots}"
            )
        for name, target in (("target_cpu", target_cpu), ("target_memory", target_memory)):
            if not 0 < target <= 1:
                raise InvalidArgumentError(f"{name} must be within (0, 1], got {target}")
        super().__init__()
        self.target_cpu = target_cpu
        self.target_memory = target_memory
        self.min_slots = min_slots
        self.max_slots = max_slots
        self.ramp_throttle_s = ramp_throttle_s
        self.sample_period_s = sample_period_s
        self.cpu_threshold = cpu_threshold
        self.memory_threshold = memory_threshold
        self._sampler = sampler
        self._clock = clock
        self.cpu_filter = CDMKalmanFilter()
        self.memory_filter = CDMKalmanFilter()
        self.cpu_pid = PIDController(*pid_gains)
        self.memory_pid = PIDController(*pid_gains)
        self._has_room = False
        self._last_issue: float | None = None
        self._last_sample_at: float | None = None
        self._waiters: deque[asyncio.Future[SlotPermit]] = deque()
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._sample_in_background = sample_in_background
        self._sampling: asyncio.Task[None] | None = None
        # metrics
        self.cpu = 0.0
        self.memory = 0.0
        self.cpu_output = 0.0
        self.memory_output = 0.0

    @classmethod
    def from_config(
        cls, config: Any, sampler: ResourceSampler | None = None
    ) -> ResourceBasedSlotSupplier:
        return cls(
            target_cpu=config.target_cpu,
            target_memory=config.target_memory,
            min_slots=config.min_slots,
            max_slots=config.max_slots,
            ramp_throttle_s=config.ramp_throttle_ms / 1000,
            sample_period_s=config.sample_period_ms / 1000,
            sampler=sampler,
        )

    # -- deciding ----------------------------------------------------------------------
    def observe(self, sample: ResourceSample, dt_s: float | None = None) -> None:
        """Feed one sample (the sampling task does this every period); wakes waiters."""
        now = self._clock()
        if dt_s is None:
            last = self._last_sample_at
            dt_s = self.sample_period_s if last is None or now <= last else now - last
        self._last_sample_at = now
        self.cpu = self.cpu_filter.update(sample.cpu)
        self.memory = self.memory_filter.update(sample.memory)
        # Time in sample periods keeps the gains' meaning whatever the period is.
        steps = dt_s / self.sample_period_s
        self.cpu_output = self.cpu_pid.update(self.target_cpu - self.cpu, steps)
        self.memory_output = self.memory_pid.update(self.target_memory - self.memory, steps)
        self._has_room = (
            self.cpu_output > self.cpu_threshold and self.memory_output > self.memory_threshold
        )
        self._grant_waiters()

    def _may_issue(self) -> bool:
        if self.issued < self.min_slots:
            return True
        if self.issued >= self.max_slots or not self._has_room:
            return False
        last = self._last_issue
        return last is None or self._clock() - last >= self.ramp_throttle_s

    def _issue(self) -> SlotPermit:
        self._last_issue = self._clock()
        return self.new_permit()

    @property
    def available(self) -> int:
        """Slots that could be issued now (0 or 1: the supplier ramps one at a time)."""
        return int(self._may_issue())

    # -- the supplier hooks -------------------------------------------------------------
    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        self._ensure_sampling()
        if self._waiters or not self._may_issue():
            return None
        return self._issue()

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        self._ensure_sampling()
        if not self._waiters and self._may_issue():
            return self._issue()
        waiter: asyncio.Future[SlotPermit] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._arm_throttle_timer()
        try:
            return await waiter  # resolved by _grant_waiters with a permit already issued
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                waiter.result().release(SlotReleaseReason.NEVER_USED)  # granted as cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self._grant_waiters()

    def _grant_waiters(self) -> None:
        """Hand slots to waiters in arrival order while the rules allow.

        The permit is issued here, not in the waiter's continuation, so the count and
        the ramp throttle see it at once and two wake-ups in one tick cannot overshoot.
        """
        while self._waiters and self._may_issue():
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._issue())
        self._arm_throttle_timer()

    def _arm_throttle_timer(self) -> None:
        """If only the ramp throttle holds a waiter back, wake up when it expires."""
        if not self._waiters or self._throttle_timer is not None or not self._has_room:
            return
        if self.issued >= self.max_slots or self._last_issue is None:
            return
        delay_s = self._last_issue + self.ramp_throttle_s - self._clock()
        if delay_s > 0:
            self._throttle_timer = asyncio.get_running_loop().call_later(
                delay_s, self._throttle_expired
            )

    def _throttle_expired(self) -> None:
        self._throttle_timer = None
        self._grant_waiters()

    # -- sampling ----------------------------------------------------------------------
    def _ensure_sampling(self) -> None:
        if self._sampling is None and self._sample_in_background:
            self._sampling = asyncio.get_running_loop().create_task(
                self._sample_loop(), name="resource-slots-sampler"
            )

    async def _sample_loop(self) -> None:
        sampler = self._sampler or default_sampler()
        self._sampler = sampler
        while True:
            try:
                self.observe(sampler.sample())
            except Exception:
                log.exception("resource sampling failed; keeping the last decision")
            await asyncio.sleep(self.sample_period_s)  # a sampling timer, not a poll

    async def close(self) -> None:
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        if self._sampling is not None:
            await cancel_and_wait(self._sampling)
            self._sampling = None
