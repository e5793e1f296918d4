"""Discrete-time simulation of a stateless-worker pool, static vs PID scale-down.

Model. Time is continuous between the samples, which are taken every ``step_s`` (0.1 s
by default): every message is handed out at its own arrival time, and a worker is free
again the moment its last message finishes, so it can take a message that arrives
later in the same step. A message therefore occupies a worker for exactly its service
time (mean ``service_s``), not for a whole number of steps.

* **Scale-up rules** (both runs): each arriving message goes to an idle worker if
  there is one (lowest index first); else a new worker is created, up to
  ``max_workers``; else it queues on the worker with the fewest waiting messages.
  Messages with the same arrival time are handed out together, in that order.
* **Workers** process their own FIFO queue one message at a time; the next message
  starts the instant the previous one finishes. A message takes
  ``service_s x (1 + jitter x (U - 0.5))`` (±25 %, 0.075-0.125 s, by default). The draws come
  from a table indexed by (worker slot, how many messages that slot has started), so
  two runs that make the same decisions see the same service times: static and
  dynamic, or two GA candidates, differ only by what the controller did.
* **Scale-down** (dynamic run only): every ``inspection_period_s``, at the start of a
  step and before that step's arrivals, the pool feeds the
  :class:`~conveyor.workers.pools.scaledown.ScaleDownController` — the same object the real
  pool uses — with the average waiting count and the idle count, and removes the
  highest-numbered idle worker when told to.

Measured at the end of every step: worker count; *waiting count* per worker =
messages assigned to it and not finished (the one in service included; the signal
the controller sees); *queue length* = messages accepted by the pool and not yet
started (waiting behind another message); arrivals per second. *Busy workers* is the
exact time average over the step of the number of workers with a message (so by
Little's law its mean is the arrival rate x the mean service time).

The loop is vectorised over a *batch* of independent pools (NumPy arrays of shape
``(batch, max_workers)``), so a GA generation simulates its whole population in one
pass; a single run is a batch of one. Every pool in a batch sees the same arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.platform.errors import InvalidArgumentError
from conveyor.workers.pools.scaledown import ScaleDownController, ScaleDownPolicy

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]
    Ints = npt.NDArray[np.int64]

_SERVICE_TABLE_LEN = 1024
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Pool and run settings; the defaults are the reference's, for comparability."""

    max_workers: int = 50
    duration_s: float = 60.0
    step_s: float = 0.1
    service_s: float = 0.1
    service_jitter: float = 0.5
    policy: ScaleDownPolicy = field(default_factory=ScaleDownPolicy)

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise InvalidArgumentError(f"max_workers must be >= 1, got {self.max_workers}")
        if not (self.step_s > 0 and self.duration_s > 0 and self.service_s > 0):
            raise InvalidArgumentError("step_s, duration_s and service_s must be > 0")
        if not 0 <= self.service_jitter < 2:
            raise InvalidArgumentError(
                f"service_jitter must be within [0, 2), got {self.service_jitter}"
            )

    @property
    def steps(self) -> int:
        return math.ceil(self.duration_s / self.step_s - _EPS)

    @property
    def inspection_every(self) -> int:
        """Steps between two scale-down inspections (at least 1)."""
        return max(1, round(self.policy.inspection_period_s / self.step_s))


@dataclass(frozen=True, slots=True)
class SimTrace:
    """Per-step series of one pool (time is the end of each step)."""

    time_s: Floats
    rate: Floats
    workers: Ints
    queue_length: Ints
    avg_waiting: Floats
    idle: Ints
    created: Ints
    """Workers created in each step (scale-up events)."""
    busy: Floats
    """Time-average number of busy workers (holding a message) over each step."""
    arrived: int
    completed: int
    in_pool: int
    """Messages assigned to a worker and not finished when the run ended."""

    @property
    def avg_workers(self) -> float:
        return float(self.workers.mean())

    @property
    def avg_queue_length(self) -> float:
        return float(self.queue_length.mean())

    @property
    def avg_busy(self) -> float:
        return float(self.busy.mean())

    @property
    def avg_avg_waiting(self) -> float:
        return float(self.avg_waiting.mean())


def step_counts(arrivals: Floats, config: SimConfig) -> Ints:
    """Arrivals per step; arrivals at or after the end of the run are dropped."""
    import numpy as np

    idx = np.floor(arrivals / config.step_s + _EPS).astype(np.int64)
    idx = idx[(idx >= 0) & (idx < config.steps)]
    return np.bincount(idx, minlength=config.steps).astype(np.int64)


def simulate(
    arrivals: Floats,
    config: SimConfig,
    gains: Sequence[tuple[float, float, float]] | None,
    seed: int = 0,
) -> list[SimTrace]:
    """Run one pool per entry of ``gains`` (dynamic), or one static pool if ``None``."""
    import numpy as np

    counts = step_counts(arrivals, config)
    batch = 1 if gains is None else len(gains)
    if batch == 0:
        return []
    controllers = None if gains is None else _controllers(gains, config)
    pool = _Pool(batch, config, np.random.default_rng([seed, 0x5E7]))
    steps = config.steps
    step_s = config.step_s
    bounds, at_list, howmany_list = _schedule(arrivals, config)
    workers = np.zeros((batch, steps), dtype=np.int64)
    queue = np.zeros((batch, steps), dtype=np.int64)
    waiting = np.zeros((batch, steps), dtype=np.float64)
    idle = np.zeros((batch, steps), dtype=np.int64)
    created = np.zeros((batch, steps), dtype=np.int64)
    busy = np.zeros((batch, steps), dtype=np.float64)
    every = config.inspection_every
    for i in range(steps):
        start = i * step_s
        if controllers is not None and i > 0 and i % every == 0:
            pool.inspect(controllers, round(start, 9))
        offset = 0.0  # seconds into this step that the pool has been advanced to
        for j in range(bounds[i], bounds[i + 1]):
            t = max(at_list[j] - start, 0.0)
            if t > offset:
                pool.advance(t - offset)
                offset = t
            created[:, i] += pool.assign(howmany_list[j])
        pool.advance(step_s - offset)
        busy[:, i] = pool.take_busy_s() / step_s
        workers[:, i], queue[:, i], waiting[:, i], idle[:, i] = pool.observe()
    time_s = ((np.arange(steps) + 1) * config.step_s).astype(np.float64)
    rate = counts / config.step_s
    in_pool = pool.n.sum(axis=1)
    arrived = int(counts.sum())
    return [
        SimTrace(time_s=time_s, rate=rate, workers=workers[b], queue_length=queue[b],
                 avg_waiting=waiting[b], idle=idle[b], created=created[b], busy=busy[b],
                 arrived=arrived, completed=int(pool.completed[b]), in_pool=int(in_pool[b]))
        for b in range(batch)
    ]


def _controllers(
    gains: Sequence[tuple[float, float, float]], config: SimConfig
) -> list[ScaleDownController]:
    """One controller per gain set, with the config's loop settings."""
    policy = config.policy
    return [
        ScaleDownController(ScaleDownPolicy(
            kp=kp, ki=ki, kd=kd, inspection_period_s=policy.inspection_period_s,
            dead_zone_cycles=policy.dead_zone_cycles, backoff_s=policy.backoff_s,
            idle_keepalive_s=policy.idle_keepalive_s,
        ))
        for kp, ki, kd in gains
    ]


def _schedule(arrivals: Floats, config: SimConfig) -> tuple[list[int], list[float], list[int]]:
    """Distinct arrival times with their counts, and where each step's ones start."""
    import numpy as np

    steps, step_s = config.steps, config.step_s
    times = np.sort(np.asarray(arrivals, dtype=np.float64))
    step_of = np.floor(times / step_s + _EPS).astype(np.int64)
    keep = (step_of >= 0) & (step_of < steps)
    times, step_of = times[keep], step_of[keep]
    at, first, howmany = np.unique(times, return_index=True, return_counts=True)
    step_of = step_of[first]
    bounds = np.searchsorted(step_of, np.arange(steps + 1)).tolist()
    return bounds, at.tolist(), howmany.tolist()


class _Pool:
    """The state of ``batch`` pools; rows are pools, columns worker slots."""

    def __init__(self, batch: int, config: SimConfig, rng: np.random.Generator) -> None:
        import numpy as np

        m = config.max_workers
        self.config = config
        self.alive = np.zeros((batch, m), dtype=bool)
        self.n = np.zeros((batch, m), dtype=np.int64)  # assigned, unfinished
        self.remaining = np.zeros((batch, m), dtype=np.float64)  # of the one in service
        self.started = np.zeros((batch, m), dtype=np.int64)
        self.completed = np.zeros(batch, dtype=np.int64)
        self.busy_s = np.zeros(batch, dtype=np.float64)  # worker-seconds since last take
        self.now_s = 0.0  # how far the pools have been advanced
        self.idle_since = np.zeros((batch, m), dtype=np.float64)  # when each went idle
        jitter = config.service_jitter
        self.service = config.service_s * (
            1.0 + jitter * (rng.random((m, _SERVICE_TABLE_LEN)) - 0.5)
        )

    def _start(self, mask: npt.NDArray[np.bool_]) -> None:
        rows, cols = mask.nonzero()
        self.remaining[rows, cols] += self.service[
            cols, self.started[rows, cols] % _SERVICE_TABLE_LEN
        ]
        self.started[rows, cols] += 1

    def assign(self, k: int) -> Ints:
        """Hand ``k`` messages to every pool by the scale-up rules; return workers created."""
        import numpy as np

        alive, n = self.alive, self.n
        idle = alive & (n == 0)
        reuse = idle & (np.cumsum(idle, axis=1) <= k)
        n[reuse] = 1
        self.remaining[reuse] = 0.0
        self._start(reuse)
        rest = k - reuse.sum(axis=1)
        created = np.zeros(len(n), dtype=np.int64)
        if not rest.any():
            return created
        free = ~alive
        create = free & (np.cumsum(free, axis=1) <= rest[:, None])
        alive |= create
        n[create] = 1
        self.remaining[create] = 0.0
        self._start(create)
        created = np.asarray(create.sum(axis=1), dtype=np.int64)
        rest -= created
        big = np.iinfo(np.int64).max
        while rest.any():
            # water-filling: one message to every worker at the lowest level, in order
            level = np.where(alive, n, big).min(axis=1)
            at = alive & (n == level[:, None])
            give = at & (np.cumsum(at, axis=1) <= rest[:, None])
            n += give
            rest -= give.sum(axis=1)
        return created

    def inspect(self, controllers: list[ScaleDownController], now_s: float) -> None:
        import numpy as np

        alive, n = self.alive, self.n
        count = alive.sum(axis=1)
        avg = n.sum(axis=1) / np.maximum(count, 1)
        idle = alive & (n == 0)
        idle_count = idle.sum(axis=1)
        since = np.where(idle, self.idle_since, np.inf)
        longest = since.argmin(axis=1)
        for b, ctl in enumerate(controllers):
            idle_for = max(now_s - float(since[b, longest[b]]), 0.0) if idle_count[b] else 0.0
            if ctl.inspect(now_s, float(avg[b]), int(idle_count[b]), idle_for):
                slots = np.flatnonzero(idle[b])
                if idle_for >= ctl.policy.idle_keepalive_s > 0:
                    alive[b, longest[b]] = False  # the keep-alive: the longest idle goes
                elif len(slots):
                    alive[b, slots[-1]] = False

    def advance(self, dt: float) -> None:
        """Let every worker work for ``dt`` seconds; a worker may finish several messages,
        each next one starting the instant the previous one finished."""
        import numpy as np

        n, remaining = self.n, self.remaining
        busy = n > 0
        self.busy_s += busy.sum(axis=1) * dt
        self.now_s += dt
        remaining[busy] -= dt
        done = busy & (remaining <= _EPS)
        while done.any():
            n -= done
            self.completed += done.sum(axis=1)
            more = done & (n > 0)
            went_idle = done & ~more
            # idle for the rest of dt: -remaining seconds (remaining <= 0 here)
            self.busy_s += np.where(went_idle, np.minimum(remaining, 0.0), 0.0).sum(axis=1)
            # it finished -remaining seconds before now
            self.idle_since[went_idle] = self.now_s + remaining[went_idle]
            remaining[went_idle] = 0.0
            self._start(more)  # the next one starts when the last one finished
            done = more & (remaining <= _EPS)

    def take_busy_s(self) -> Floats:
        """Busy worker-seconds accumulated since the last call, per pool."""
        import numpy as np

        out = self.busy_s
        self.busy_s = np.zeros_like(out)
        return out

    def observe(self) -> tuple[Ints, Ints, Floats, Ints]:
        import numpy as np

        alive, n = self.alive, self.n
        count = alive.sum(axis=1)
        queued = np.maximum(n - 1, 0).sum(axis=1)
        avg = n.sum(axis=1) / np.maximum(count, 1)
        idle = (alive & (n == 0)).sum(axis=1)
        return count, queued, avg, idle


@dataclass(frozen=True, slots=True)
class Comparison:
    static: SimTrace
    dynamic: SimTrace


def compare(
    arrivals: Floats,
    config: SimConfig,
    gains: tuple[float, float, float] | None = None,
    seed: int = 0,
) -> Comparison:
    """The static (scale-up only) and dynamic (PID scale-down) runs of one arrival series.

    ``gains`` default to the policy's (the shipped defaults).
    """
    if gains is None:
        gains = (config.policy.kp, config.policy.ki, config.policy.kd)
    (static,) = simulate(arrivals, config, None, seed)
    (dynamic,) = simulate(arrivals, config, [gains], seed)
    return Comparison(static=static, dynamic=dynamic)
