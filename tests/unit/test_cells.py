"""Cells: pull-based workers, job timeouts, resizing without dropping a job."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from conveyor.workers.cells.cells import Cell, CellJobTimeout, CellRouter, _Job, parse_cell_key
from tests.conftest import wait_until


async def test_a_cell_runs_at_most_its_size_at_once() -> None:
    cell = Cell("a", 3, None)
    active = peak = 0

    async def job() -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.005)
        active -= 1

    await asyncio.gather(*(cell.submit(job) for _ in range(30)))
    assert peak == 3 and cell.handled == 30 and cell.queue_length == 0
    await cell.close()


async def test_a_job_that_times_out_fails_with_cell_job_timeout() -> None:
    cell = Cell("a", 1, 0.05)
    with pytest.raises(CellJobTimeout):
        await cell.submit(lambda: asyncio.sleep(10))
    assert cell.timed_out == 1
    assert await cell.submit(lambda: asyncio.sleep(0, "next")) == "next"  # worker survives
    await cell.close()


async def test_shrinking_lets_busy_workers_finish_then_stop_and_drops_no_job() -> None:
    cell = Cell("a", 4, None)
    gate = asyncio.Event()
    done: list[int] = []
    active = peak = 0

    async def job(i: int) -> int:
        nonlocal active, peak
        if i < 4:  # the four in flight when the cell shrinks
            await gate.wait()
        else:
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.002)  # long enough for other workers to overlap
            active -= 1
        done.append(i)
        return i

    runs = [asyncio.create_task(cell.submit(partial(job, i))) for i in range(20)]
    await wait_until(lambda: cell.busy == 4, 2, what="four busy workers")
    trimmed = [w.task for w in cell.workers[1:]]
    cell.resize(1)
    assert cell.size == 1
    gate.set()
    assert sorted(await asyncio.gather(*runs)) == list(range(20))
    assert sorted(done) == list(range(20))
    # Once the in-flight jobs finished, only the one remaining worker took jobs.
    assert peak == 1
    await wait_until(lambda: all(t is not None and t.done() for t in trimmed), 2,
                     what="trimmed workers stopped")
    await wait_until(lambda: cell.busy == 0, 2, what="idle")
    cell.resize(3)
    assert cell.size == 3
    assert await cell.submit(lambda: asyncio.sleep(0, "grown")) == "grown"
    await cell.close()


async def test_shrinking_idle_workers_does_not_lose_jobs_handed_to_them() -> None:
    cell = Cell("a", 5, None)
    await asyncio.sleep(0)  # all five are parked in ready(), oldest first
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future[object]] = []
    for i in range(5):  # synchronously: job i is handed to worker i, newest last
        fut = loop.create_future()
        cell.dispatcher.submit(_Job(partial(asyncio.sleep, 0, i), fut))
        futs.append(fut)
    assert not cell.dispatcher.pending  # every job went to a parked worker
    cell.resize(1)  # cancels the four newest, each holding a job it has not started
    assert await asyncio.wait_for(asyncio.gather(*futs), 2) == [0, 1, 2, 3, 4]
    assert cell.dispatcher.handed_back == 4
    assert cell.handled == 5 and cell.size == 1
    await cell.close()


async def test_router_makes_cells_on_demand_with_configured_sizes() -> None:
    router = CellRouter("h", default_size=2, sizes={"big": 5})
    assert router.cell("big").size == 5 and router.cell("small").size == 2
    router.resize("small", 3)
    router.resize("later", 7)
    assert router.cell("small").size == 3 and router.cell("later").size == 7
    assert router.snapshot()["big"] == {"size": 5, "busy": 0, "queue_length": 0}
    await router.close()


def test_cell_key_names_a_header_or_a_body_field() -> None:
    assert parse_cell_key("header:tenant") == ("header", "tenant")
    assert parse_cell_key("body:customer_id") == ("body", "customer_id")
    for bad in ("tenant", "query:x", "body:"):
        with pytest.raises(ValueError):
            parse_cell_key(bad)
