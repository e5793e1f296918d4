"""When the supervisor adds or removes a process: settings and the decision, pure.

Every inspection period the supervisor reads the lag of every queue and asks
:meth:`LagScaler.decide`:

* **up** — when lag per process has stayed above ``lag_per_process`` for
  ``scale_up_cycles`` inspections, one more process (never more than ``MAX``, never
  more processes than queues);
* **down** — the lag, in units of the threshold, is fed to the same PID
  :class:`~conveyor.workers.pools.scaledown.ScaleDownController` that shrinks worker pools;
  a process counts as *idle* when its queues' lag is at most ``idle_lag_per_process``.
  When the controller says so, one idle process (never below ``MIN``) is removed:
  :func:`choose_victim` picks which.

Nothing here touches a process or the clock: the decision is unit-tested on an
explicit time line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from conveyor.platform.config import Config
from conveyor.platform.errors import InvalidArgumentError
from conveyor.workers.pools.scaledown import ScaleDownController, ScaleDownPolicy


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    min_processes: int
    max_processes: int
    lag_per_process: int = 1000
    idle_lag_per_process: int = 50
    inspection_period_s: float = 0.5
    scale_up_cycles: int = 2
    scale_up_backoff_s: float = 2.0
    scale_down: ScaleDownPolicy = field(default_factory=ScaleDownPolicy)
    stop_timeout_s: float = 60.0
    silent_child_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_processes <= self.max_processes:
            raise InvalidArgumentError(
                f"--processes needs 1 <= MIN <= MAX, got {self.min_processes}:{self.max_processes}"
            )

    @classmethod
    def from_config(
        cls, config: Config, min_processes: int, max_processes: int
    ) -> SupervisorSettings:
        s = config.supervisor
        period_s = s.inspection_period_ms / 1000
        return cls(
            min_processes=min_processes,
            max_processes=max_processes,
            lag_per_process=s.lag_per_process,
            idle_lag_per_process=(
                s.idle_lag_per_process if s.idle_lag_per_process is not None
                else s.lag_per_process // 20
            ),
            inspection_period_s=period_s,
            scale_up_cycles=s.scale_up_cycles,
            scale_up_backoff_s=s.scale_up_backoff_s,
            scale_down=ScaleDownPolicy(
                inspection_period_s=period_s,
                dead_zone_cycles=s.scale_down_dead_zone_cycles,
                backoff_s=s.scale_down_backoff_s,
            ),
            stop_timeout_s=config.worker.drain_timeout_s + 30,
            silent_child_s=s.silent_child_s,
        )


class Decision(enum.Enum):
    HOLD = "hold"
    UP = "up"
    DOWN = "down"


class LagScaler:
    """The supervisor's decision, pure and on an explicit clock (unit-testable)."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.controller = ScaleDownController(settings.scale_down)
        self._above = 0
        self._last_up: float | None = None

    def decide(self, now_s: float, lag_by_process: list[int], total_queues: int) -> Decision:
        s = self.settings
        n = len(lag_by_process)
        per_process = sum(lag_by_process) / n
        idle = sum(1 for lag in lag_by_process if lag <= s.idle_lag_per_process)
        # Waiting count in units of the threshold keeps the pool gains' scale. What the
        # controller is told it may remove is every process above MIN (when one of them
        # is idle), not the idle count: its anti-windup keeps (m-1)/m of the integral
        # after a removal, and over idle processes that is 0 whenever the first removal
        # finds a single idle one while the others still drain — the integral is zeroed,
        # no lag is left to rebuild it, and the supervisor stays above MIN for good.
        # Spread over the processes above MIN, a burst's integral lasts until MIN.
        removable = max(0, n - s.min_processes) if idle else 0
        remove = self.controller.inspect(now_s, per_process / s.lag_per_process, removable)
        self._above = self._above + 1 if per_process > s.lag_per_process else 0
        ceiling = min(s.max_processes, total_queues)
        if self._above >= s.scale_up_cycles and n < ceiling and (
            self._last_up is None or now_s - self._last_up >= s.scale_up_backoff_s
        ):
            self._above = 0
            self._last_up = now_s
            return Decision.UP
        return Decision.DOWN if remove else Decision.HOLD


def choose_victim(lag_by_process: list[int], numbers: list[int], idle_lag: int) -> int | None:
    """Index of the process to remove: an idle one, least lag first, then the newest."""
    idle = [
        (lag, -number, i)
        for i, (lag, number) in enumerate(zip(lag_by_process, numbers, strict=True))
        if lag <= idle_lag
    ]
    return min(idle)[2] if idle else None
