"""Stateless-worker pool: the scale-up rules and the scale-down controller wired in."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable

import pytest

from conveyor.workers.pools.pool import StatelessWorkerPool
from conveyor.workers.pools.scaledown import ScaleDownController, ScaleDownPolicy
from tests.conftest import wait_until


async def test_an_idle_worker_is_reused_before_a_new_one_is_created() -> None:
    pool = StatelessWorkerPool("p", max_workers=4)
    for i in range(5):
        assert await pool.run(lambda i=i: asyncio.sleep(0, i)) == i
    assert pool.size == 1 and pool.created == 1
    await pool.close()


async def test_busy_workers_make_the_pool_grow_up_to_its_maximum_only() -> None:
    pool = StatelessWorkerPool("p", max_workers=3)
    gate = asyncio.Event()
    runs = [asyncio.create_task(pool.run(gate.wait)) for _ in range(7)]
    await wait_until(lambda: pool.size == 3, 2, what="three workers")
    await asyncio.sleep(0)
    assert pool.size == 3 and pool.peak_workers == 3
    gate.set()
    await asyncio.gather(*runs)
    await pool.close()


async def test_when_full_a_job_goes_to_the_worker_with_the_fewest_waiting() -> None:
    pool = StatelessWorkerPool("p", max_workers=2)
    gates = [asyncio.Event() for _ in range(2)]
    first = [asyncio.create_task(pool.run(g.wait)) for g in gates]
    await wait_until(lambda: pool.idle_workers == 0 and pool.size == 2, 2, what="busy")
    a, b = pool.workers
    extra_a = asyncio.create_task(pool.run(gates[0].wait))  # goes to either: both empty
    await asyncio.sleep(0)
    loaded = a if a.inbox else b
    other = b if loaded is a else a
    nxt = asyncio.create_task(pool.run(lambda: asyncio.sleep(0)))
    await asyncio.sleep(0)
    assert len(other.inbox) == 1 and len(loaded.inbox) == 1
    for g in gates:
        g.set()
    await asyncio.gather(*first, extra_a, nxt)
    await pool.close()


async def test_jobs_queued_behind_a_blocked_call_are_taken_by_a_free_worker() -> None:
    pool = StatelessWorkerPool("p", max_workers=2)
    stuck, short = asyncio.Event(), asyncio.Event()
    blocked = asyncio.create_task(pool.run(stuck.wait))  # never returns in this test
    first = asyncio.create_task(pool.run(short.wait))
    await wait_until(lambda: pool.idle_workers == 0 and pool.size == 2, 2, what="both busy")
    queued = [asyncio.create_task(pool.run(lambda i=i: asyncio.sleep(0, i))) for i in range(10)]
    await asyncio.sleep(0)
    assert all(len(w.inbox) == 5 for w in pool.workers)  # half behind the blocked call
    short.set()
    assert await asyncio.wait_for(asyncio.gather(*queued), 2) == list(range(10))
    assert pool.stolen == 5 and not blocked.done()
    await first
    await pool.close()
    assert blocked.cancelled()


async def test_job_exceptions_reach_the_caller_and_the_worker_survives() -> None:
    pool = StatelessWorkerPool("p", max_workers=1)

    async def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await pool.run(boom)
    assert await pool.run(lambda: asyncio.sleep(0, "ok")) == "ok"
    assert pool.size == 1
    await pool.close()


async def test_without_scale_down_no_collector_runs_and_workers_stay() -> None:
    pool = StatelessWorkerPool("p", max_workers=4)
    gate = asyncio.Event()
    runs = [asyncio.create_task(pool.run(gate.wait)) for _ in range(4)]
    await wait_until(lambda: pool.size == 4, 2, what="four workers")
    gate.set()
    await asyncio.gather(*runs)
    assert pool.controller is None and pool._collector is None
    assert pool.size == 4
    await pool.close()


async def test_after_a_burst_the_controller_removes_idle_workers_one_at_a_time() -> None:
    policy = ScaleDownPolicy(inspection_period_s=1.0, dead_zone_cycles=2, backoff_s=1.0)
    pool = StatelessWorkerPool("p", max_workers=4, scale_down=policy, rng=random.Random(1))
    gate = asyncio.Event()
    runs = [asyncio.create_task(pool.run(gate.wait)) for _ in range(12)]
    await wait_until(lambda: pool.size == 4, 2, what="four workers")
    # Drive the controller on a simulated clock: load first (avg waiting 3), then idle.
    now = 0.0
    for _ in range(3):
        now += 1.0
        assert not pool.inspect(now)  # under load: no worker is idle, none removed
    gate.set()
    await asyncio.gather(*runs)
    assert pool.idle_workers == 4
    removals: list[float] = []
    for _ in range(20):
        now += 1.0
        if pool.inspect(now):
            removals.append(now)
    assert pool.size == 0 and pool.removed == 4
    # dead zone of 2 cycles and a back-off: never two removals in consecutive inspections
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(removals))
    # the pool still works after shrinking to nothing
    assert await pool.run(lambda: asyncio.sleep(0, 1)) == 1
    await pool.close()


async def test_the_collector_shrinks_a_real_pool_on_its_own() -> None:
    policy = ScaleDownPolicy(inspection_period_s=0.02, dead_zone_cycles=1, backoff_s=0.0)
    pool = StatelessWorkerPool("p", max_workers=3, scale_down=policy)
    gate = asyncio.Event()
    runs = [asyncio.create_task(pool.run(gate.wait)) for _ in range(9)]
    inspections = 0
    inspect = pool.inspect

    def counted(now_s: float | None = None) -> bool:
        nonlocal inspections
        inspections += 1
        return inspect(now_s)

    pool.inspect = counted  # type: ignore[method-assign]
    await wait_until(lambda: pool.size == 3, 2, what="three workers")
    # The load is observed by a few inspections before it goes away.
    await wait_until(lambda: inspections >= 3, 2, what="three inspections under load")
    gate.set()
    await asyncio.gather(*runs)
    await wait_until(lambda: pool.size == 0, 5, what="the pool to shrink to zero")
    await pool.close()


async def idle_pool(seed: int, workers: int) -> StatelessWorkerPool:
    pool = StatelessWorkerPool("p", max_workers=workers, rng=random.Random(seed))
    gate = asyncio.Event()
    runs = [asyncio.create_task(pool.run(gate.wait)) for _ in range(workers)]
    await wait_until(lambda: pool.size == workers, 2, what="all workers started")
    gate.set()
    await asyncio.gather(*runs)
    await wait_until(lambda: pool.idle_workers == workers, 2, what="all workers idle")
    return pool


async def test_the_idle_worker_removed_is_chosen_at_random() -> None:
    removed = []
    for seed in range(20):
        pool = await idle_pool(seed, workers=5)
        before = {w.name for w in pool.workers}
        assert pool.remove_idle_worker()
        [gone] = before - {w.name for w in pool.workers}
        removed.append(gone)
        await pool.close()
    # Five candidates each time: a fixed pick (first, last, oldest) would give one name.
    assert len(set(removed)) >= 3, removed
    again = await idle_pool(7, workers=5)  # and a seeded pool is reproducible
    assert again.remove_idle_worker()
    assert {w.name for w in again.workers} | {removed[7]} == {f"p-{i}" for i in range(1, 6)}
    await again.close()


async def test_workers_of_a_load_no_inspection_saw_come_to_rest_after_the_keepalive() -> None:
    """A spike handled between two inspections: the signal never goes negative, yet the
    idle workers go, longest-idle first, once idle ``idle_keepalive_s``."""
    policy = ScaleDownPolicy(inspection_period_s=0.02, dead_zone_cycles=2, backoff_s=0.0,
                             idle_keepalive_s=0.3)
    pool = StatelessWorkerPool("p", max_workers=3, scale_down=policy)
    def job(i: int) -> Callable[[], Awaitable[int]]:
        return lambda: asyncio.sleep(0, i)  # done before the first inspection

    assert await asyncio.gather(*(pool.run(job(i)) for i in range(3))) == [0, 1, 2]
    assert pool.size == 3
    assert pool.controller is not None and pool.controller.signal == 0  # it saw no load
    t0 = time.monotonic()
    await wait_until(lambda: pool.size == 0, 5, what="the idle workers to be removed")
    assert time.monotonic() - t0 >= 0.3 * 0.9  # not before the keep-alive
    await pool.close()


def test_the_keepalive_removes_only_past_its_time_and_within_the_back_off() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(idle_keepalive_s=5.0, backoff_s=0.5))
    assert not ctl.inspect(1.0, 0.0, 3, idle_for_s=4.9)
    assert ctl.inspect(1.5, 0.0, 3, idle_for_s=5.0)
    assert not ctl.inspect(1.7, 0.0, 2, idle_for_s=9.0)  # back-off since the last removal
    assert ctl.inspect(2.0, 0.0, 2, idle_for_s=9.0)
    assert not ctl.inspect(2.5, 0.0, 0, idle_for_s=9.0)  # nobody idle: nothing to remove
    off = ScaleDownController(ScaleDownPolicy(idle_keepalive_s=0.0))
    assert not any(off.inspect(t, 0.0, 3, idle_for_s=1e6) for t in (1.0, 2.0, 3.0))
