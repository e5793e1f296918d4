"""No-op throughput on Redis: one daemon in-process, two daemon processes, raw floor.

All three figures are measured in the same run against the same server:

* **floor** — a bare redis-py loop, one task per queue, ``XREADGROUP COUNT <batch>``
  then ``XACK`` of the ids, no decoding: the least any Redis consumer must do. It runs
  on a stock client of its own (redis-py's reply parsing, one argument per acked id),
  not on the adapter's, whose XREADGROUP replies are left unparsed for its decoder.
* **1 daemon** — :func:`conveyor.bench.throughput` 's pipeline: N messages enqueued
  (not timed), one :class:`WorkerDaemon` started and timed until all are acknowledged.
  It runs as ``configs/redis.toml`` ships: the dynamic balancer with Redis membership,
  so every queue is leased and acknowledged through the fenced script (checked after
  the run: a lease token was issued for every queue).
* **2 daemons** — two ``conveyor worker`` processes with Redis membership share the
  queues; the group is parked at the stream ends while they start, then moved back
  to the start (timing begins) and the run ends when no queue has lag left. CPU is the
  two processes' CPU time over that window.

``ratio = msgs_per_s / floor_msgs_per_s``; every figure is the median of ``repeats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from conveyor.adapters.redis import RedisAdapter, encode_fields, wait_ready
from conveyor.adapters.redis_conn import connect
from conveyor.bench import BenchmarkError
from conveyor.bench.throughput import ThroughputResult, _messages, _pipeline
from conveyor.platform.client import Client
from conveyor.platform.config import Config, load_config
from conveyor.platform.mapper import HashRingQueueMapper

GROUP = "bench"


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A throw-away redis-server on a free port (no persistence)."""
    if shutil.which("redis-server") is None:
        raise BenchmarkError("redis-server is not installed; pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


# Enough slots that a pull is bounded by max_batch (the floor's batch), not by slots.
SLOTS = 2048


def _config(url: str, prefix: str) -> Config:
    """As configs/redis.toml ships: leases through Redis membership, fenced acks."""
    return load_config(None, overrides={
        "queues": {"adapter": "redis"},
        "slots": {"count": SLOTS},
        "redis": {"url": url, "prefix": prefix},
        "balancer": {"kind": "dynamic", "membership": "redis"},
    })


async def _fill(adapter: RedisAdapter, config: Config, n: int, streams: int) -> None:
    mapper = HashRingQueueMapper(config.queues.total)
    by_queue: dict[int, list[Any]] = {}
    for m in _messages(Client(adapter, mapper), n, streams):
        by_queue.setdefault(mapper.queue_for(m.stream), []).append(m)
    for queue, batch in by_queue.items():
        for i in range(0, len(batch), 5000):
            await adapter.enqueue(queue, batch[i : i + 5000])


async def _drop(adapter: RedisAdapter) -> None:
    keys = [k async for k in adapter.redis.scan_iter(match=f"{adapter.keys.prefix}:*")]
    if keys:
        await adapter.redis.delete(*keys)


async def _floor(url: str, prefix: str, n: int, streams: int, batch: int) -> tuple[float, float]:
    config = _config(url, prefix)
    adapter = RedisAdapter(config.redis)
    r: Any = connect(config.redis)
    try:
        await wait_ready(adapter)
        await _fill(adapter, config, n, streams)
        keys = [adapter.keys.queue(q) for q in range(config.queues.total)]
        for key in keys:
            await r.xgroup_create(key, GROUP, "0", mkstream=True)

        async def drain(key: str) -> int:
            done = 0
            while True:
                reply = await r.xreadgroup(GROUP, "raw", {key: ">"}, count=batch)
                if not reply or not reply[0][1]:
                    return done
                ids = [eid for eid, _ in reply[0][1]]
                await r.xack(key, GROUP, *ids)
                done += len(ids)

        t0, c0 = time.perf_counter(), time.process_time()
        done = sum(await asyncio.gather(*(drain(k) for k in keys)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert done == n, (done, n)
        await _drop(adapter)
        return n / wall, cpu / n * 1e6
    finally:
        await r.aclose()
        await adapter.close()


async def _one_daemon(url: str, prefix: str, n: int, streams: int) -> tuple[float, float]:
    config = _config(url, prefix)
    made: list[RedisAdapter] = []

    def make() -> RedisAdapter:
        made.append(RedisAdapter(config.redis))
        return made[-1]

    rate, cpu = await _pipeline(make, config, n, streams)
    cleanup = RedisAdapter(config.redis)
    try:
        await _check_fenced(cleanup, config.queues.total)
    finally:
        await _drop(cleanup)
        await cleanup.close()
    return rate, cpu


async def _check_fenced(adapter: RedisAdapter, total: int) -> None:
    """Fail unless the run leased every queue (so its acks ran the fenced script)."""
    keys = adapter.keys
    tokens = await adapter.redis.mget([keys.fence(GROUP, q) for q in range(total)])
    unleased = [q for q, t in enumerate(tokens) if t is None]
    if unleased:
        raise BenchmarkError(f"queues {unleased} were never leased: the benchmark did not "
                           "run the shipped (dynamic, fenced) configuration")
    refused = await adapter.redis.hlen(keys.fenced_acks(GROUP))
    if refused:
        raise BenchmarkError(f"{refused} lease(s) had acknowledgements refused by fencing")


def _spawn_workers(cfg_path: Path, daemons: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "--log-level", "warning", "worker",
             "conveyor.bench.noop_app:app", "--config", str(cfg_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for _ in range(daemons)
    ]


async def _processes(url: str, prefix: str, n: int, streams: int, daemons: int,
                     tmp: Path) -> tuple[float, float]:
    config = _config(url, prefix)
    adapter = RedisAdapter(config.redis)
    r = adapter.redis
    total = config.queues.total
    keys = [adapter.keys.queue(q) for q in range(total)]
    cfg_path = tmp / f"{prefix}.toml"
    cfg_path.write_text(
        f'[queues]\nadapter = "redis"\n[redis]\nurl = "{url}"\nprefix = "{prefix}"\n'
        '[balancer]\nmembership = "redis"\n'
        f"[slots]\ncount = {SLOTS}\n"
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await _fill(adapter, config, n, streams)
        for key in keys:  # parked at the end while the daemons start
            await r.xgroup_create(key, GROUP, "$", mkstream=True)
        procs.extend(_spawn_workers(cfg_path, daemons))
        lease_keys = [adapter.keys.lease(GROUP, q) for q in range(total)]
        deadline = time.monotonic() + 60
        while True:
            held = [v.decode().split(" ", 1)[1] for v in await r.mget(lease_keys) if v]
            if len(held) == total and len(set(held)) == daemons and all(
                held.count(o) >= total // daemons for o in set(held)
            ):
                break
            if time.monotonic() > deadline:
                raise BenchmarkError("daemons did not share the queues within 60 s")
            await asyncio.sleep(0.05)
        ps = [psutil.Process(p.pid) for p in procs]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in ps)
        t0 = time.perf_counter()
        for key in keys:
            await r.xgroup_setid(key, GROUP, "0")
        kick = encode_fields(_messages(Client(adapter, HashRingQueueMapper(total)), 1, 1)[0])
        for key in keys:  # wakes the blocked readers at once
            await r.xadd(key, kick)
        while True:  # lag has no event to wait on: poll it finely
            if sum([await adapter.lag(q, GROUP) for q in range(total)]) == 0:
                break
            await asyncio.sleep(0.01)
        wall = time.perf_counter() - t0
        cpu = sum(sum(p.cpu_times()[:2]) for p in ps) - cpu0
        await _check_fenced(adapter, total)
        return n / wall, cpu / n * 1e6
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        await _drop(adapter)
        await adapter.close()


def _result(name: str, n: int, streams: int, runs: list[tuple[float, float]],
            floor: list[tuple[float, float]]) -> ThroughputResult:
    rate = statistics.median(x for x, _ in runs)
    floor_rate = statistics.median(x for x, _ in floor)
    return ThroughputResult(
        adapter=name, messages=n, streams=streams, msgs_per_s=rate,
        cpu_us_per_msg=statistics.median(c for _, c in runs), floor_msgs_per_s=floor_rate,
        floor_cpu_us_per_msg=statistics.median(c for _, c in floor), ratio=rate / floor_rate,
    )


async def _measure(url: str, n: int, streams: int, repeats: int,
                   daemons: tuple[int, ...]) -> dict[str, ThroughputResult]:
    batch = Config().worker.max_batch
    stamp = f"bench{os.getpid()}"
    floor = [await _floor(url, f"{stamp}f{i}", n, streams, batch) for i in range(repeats)]
    out: dict[str, ThroughputResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in daemons:
            if d == 1:
                runs = [await _one_daemon(url, f"{stamp}a{i}", n, streams)
                        for i in range(repeats)]
            else:
                runs = [await _processes(url, f"{stamp}p{d}x{i}", n, streams, d, Path(tmp))
                        for i in range(repeats)]
            out[str(d)] = _result(f"redis/{d}-daemon", n, streams, runs, floor)
    return out


def redis_throughput(
    url: str | None, messages: int, streams: int, repeats: int = 3,
    daemons: tuple[int, ...] = (1, 2),
) -> dict[str, ThroughputResult]:
    """Results keyed by daemon count; starts a private redis-server when ``url`` is None."""
    if url is not None:
        return asyncio.run(_measure(url, messages, streams, repeats, daemons))
    with private_redis() as private:
        return asyncio.run(_measure(private, messages, streams, repeats, daemons))


def as_json(results: dict[str, ThroughputResult]) -> dict[str, Any]:
    """The first daemon count's figures at top level, every count under ``by_daemons``."""
    first = next(iter(results.values()))
    return {**first.as_dict(), "by_daemons": {k: v.as_dict() for k, v in results.items()}}
