"""The stateless-worker scale-down benchmark, after the Orleans reference.

Two pools of the same size get the *same* Poisson arrival sequence at once: a
*monotonic* one (no scale-down, Orleans' default) and an *adaptive* one (the PID
controller). After the load stops, ``cycles`` cooldown cycles follow; at the end of
each, both pools report:

* ``active`` — workers alive now;
* ``average`` — time-average of the worker count since the load started (sampled every
  10 ms; banker's rounding, as in the reference);
* ``maximum`` — the most workers alive at once.

Expected shape: monotonic stays at its peak; adaptive falls to 0 by the last cycle.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from conveyor.workers.pools.pool import StatelessWorkerPool
from conveyor.workers.pools.scaledown import ScaleDownPolicy

Result = dict[str, dict[str, list[dict[str, int]]]]


@dataclass(frozen=True, slots=True)
class ScaleDownSettings:
    max_workers: int = 10
    rate_per_s: float = 400.0
    """Poisson arrival rate during the load phase."""
    work_s: float = 0.04
    """Each job's (simulated I/O) time: offered load = rate x work = 16 workers' worth."""
    load_s: float = 2.0
    cycles: int = 10
    cycle_s: float = 1.2
    """Cooldown cycle length; at the default policy (one removal per ~1 s) 10 cycles of
    1.2 s leave room to remove 10 workers."""
    policy: ScaleDownPolicy = field(default_factory=ScaleDownPolicy)
    seed: int = 7


@dataclass
class _Tracker:
    pool: StatelessWorkerPool
    samples: int = 0
    total: int = 0

    def sample(self) -> None:
        self.samples += 1
        self.total += self.pool.size

    def cycle(self) -> dict[str, int]:
        average = self.total / self.samples if self.samples else 0.0
        return {
            "active": self.pool.size,
            "average": round(average),  # banker's rounding, like the reference
            "maximum": self.pool.peak_workers,
        }


async def run_scale_down(settings: ScaleDownSettings) -> Result:
    pools = {
        "monotonic": StatelessWorkerPool("monotonic", settings.max_workers),
        "adaptive": StatelessWorkerPool(
            "adaptive", settings.max_workers, scale_down=settings.policy
        ),
    }
    trackers = {name: _Tracker(pool) for name, pool in pools.items()}
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            for t in trackers.values():
                t.sample()
            await asyncio.sleep(0.01)

    async def job() -> None:
        await asyncio.sleep(settings.work_s)

    sampler = asyncio.create_task(sample())
    rng = random.Random(settings.seed)
    inflight: set[asyncio.Task[object]] = set()
    loop = asyncio.get_running_loop()
    start = loop.time()
    at = start
    while True:
        at += rng.expovariate(settings.rate_per_s)
        if at - start >= settings.load_s:
            break
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        for pool in pools.values():
            task = asyncio.create_task(pool.run(job))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
    await asyncio.gather(*inflight)
    result: Result = {n: {"cycles": []} for n in pools}
    for _ in range(settings.cycles):
        await asyncio.sleep(settings.cycle_s)
        for name, tracker in trackers.items():
            result[name]["cycles"].append(tracker.cycle())
    stop_sampling.set()
    await sampler
    for pool in pools.values():
        await pool.close()
    return result


def scale_down(settings: ScaleDownSettings | None = None) -> Result:
    return asyncio.run(run_scale_down(settings or ScaleDownSettings()))


def table(result: Result) -> str:
    lines = ["cycle | monotonic active/avg/max | adaptive active/avg/max",
             "----- | ------------------------ | -----------------------"]
    mono, adap = result["monotonic"]["cycles"], result["adaptive"]["cycles"]
    for i, (m, a) in enumerate(zip(mono, adap, strict=True), 1):
        lines.append(
            f"{i:>5} | {m['active']:>6} / {m['average']:>3} / {m['maximum']:>3}"
            f"       | {a['active']:>6} / {a['average']:>3} / {a['maximum']:>3}"
        )
    return "\n".join(lines)
