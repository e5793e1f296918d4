"""No-op throughput on Redis, as ``configs/redis.toml`` ships, next to raw redis-py loops.

The figures and their order are :mod:`conveyor.bench.throughput`'s; what is Redis's:

* **publish floor** — one redis-py pipeline (``transaction=False``) of
  :data:`~conveyor.bench.timing.PUBLISH_BATCH` ``XADD`` per round trip, of the entries
  Conveyor writes (the same fields, already encoded), on a connection already open —
  made by :func:`~conveyor.adapters.redis.connections.connect`, so its commands are packed by
  hiredis as Conveyor's are (a stock redis-py client packs in Python, ~1.5x the CPU).
* **consume floors** — one task per queue on a stock redis-py client (its own reply
  parsing), ``XREADGROUP COUNT 500`` then ``XACK`` of the ids: the counting loop only
  counts the entries of each reply, the awaiting loop awaits the no-op on each body
  first. Each reads with a group of its own (created, and a connection per task opened,
  before its clock); the clock starts at the first reply with entries.
* **1 daemon** — in this process, from the shipped file with only ``[redis] url`` and
  ``prefix`` changed: the dynamic balancer with Redis membership, so every queue is
  leased and acknowledged through the fenced script (checked after the run).
* **2 daemons** (``--daemons 2``) — two ``conveyor worker`` processes on the same file
  share the queues; the group is parked at the stream ends while they start and lease
  (``startup_s``), then moved back to the start (the clock starts) and the run ends when
  no queue has lag left. CPU is the two processes' CPU time over that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import psutil

from conveyor.adapters.redis import RedisAdapter, wait_ready
from conveyor.adapters.redis.codec import encode_fields
from conveyor.adapters.redis.connections import connect
from conveyor.adapters.redis.keys import Keys
from conveyor.bench import BenchmarkError
from conveyor.bench.figures import ThroughputResult
from conveyor.bench.shipped import BenchConfig, Variant, bench_config
from conveyor.bench.throughput import (
    SINGLE_MAX,
    Backend,
    Floors,
    build_messages,
    noop,
    noop_batch,
    queue_chunks,
    repeat_once,
    summarize,
)
from conveyor.bench.timing import PUBLISH_BATCH, Sample, SteadyClock, bench_items
from conveyor.client import Client
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message

GROUP = "bench"
COUNT_GROUP = "bench-count"
BODY = b"body"
LEASED_TIMEOUT_S = 60.0


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
            _wait_listening(proc, port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 10.0) -> None:
    """Until the server accepts connections (a raw loop may be the first to connect)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchmarkError("the private redis-server did not start") from None
            time.sleep(0.05)


async def publish_floor(r: Any, keys: Keys, messages: Sequence[Message], total: int) -> Sample:
    """Pipelines of :data:`PUBLISH_BATCH` ``XADD`` on ``r`` (see the module docstring)."""
    chunks = [[(keys.queue(q), encode_fields(m)) for q, batch in chunk for m in batch]
              for chunk in queue_chunks(messages, total)]
    await r.ping()  # the connection is open before the clock starts
    clock = SteadyClock()
    clock.first()
    for chunk in chunks:
        pipe = r.pipeline(transaction=False)
        for key, fields in chunk:
            pipe.xadd(key, fields)
        await pipe.execute()
    return clock.stop(len(messages))


async def consume_floor(r: Any, streams: Sequence[str], messages: int,
                        count: int = PUBLISH_BATCH, batch: bool = False,
                        counting: bool = False, group: str = GROUP) -> Sample:
    """``XREADGROUP COUNT count`` + ``XACK`` over ``streams``, one task each, on ``r``,
    reading as ``group`` (created here, from the start); timed from the first reply with
    entries (set-up is ``startup_s``). The no-op is awaited on each body, or with
    ``batch`` once per reply on all its bodies; with ``counting`` nothing is awaited
    but the two commands: each reply's entries are counted."""
    clock = SteadyClock()
    for key in streams:
        await r.xgroup_create(key, group, "0", mkstream=True)
    await asyncio.gather(*(r.ping() for _ in streams))  # a connection per reader, open

    async def drain(key: str) -> int:
        done = 0
        while True:
            reply = await r.xreadgroup(group, "raw", {key: ">"}, count=count)
            if not reply or not reply[0][1]:
                return done
            clock.first()
            entries = reply[0][1]
            if batch and not counting:
                await noop_batch([fields[BODY] for _, fields in entries])
            elif not counting:
                for _, fields in entries:
                    await noop(fields[BODY])
            await r.xack(key, group, *[eid for eid, _ in entries])
            done += len(entries)

    done = sum(await asyncio.gather(*(drain(k) for k in streams)))
    sample = clock.stop(messages)
    if done != messages:
        raise BenchmarkError(f"the raw loop read {done} entries, not {messages}")
    return sample


async def _drop(r: Any, prefix: str) -> None:
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*")]
    if keys:
        await r.delete(*keys)


class RedisBackend(Backend):
    adapter = "redis"
    floor = (f"redis-py XREADGROUP COUNT {PUBLISH_BATCH} + XACK, a task per queue, the "
             "no-op awaited on each body")
    count_floor = (f"redis-py XREADGROUP COUNT {PUBLISH_BATCH} + XACK, a task per queue, "
                   "the entries counted")
    publish_floor = f"redis-py pipeline (transaction=False) of {PUBLISH_BATCH} XADD"

    def __init__(self, url: str, variant: Variant | None = None) -> None:
        super().__init__(variant)
        self.url = url
        if self.variant.batch:
            self.floor = (f"redis-py XREADGROUP COUNT {self.variant.batch} + XACK, a task "
                          "per queue, the no-op awaited once per batch")

    def config(self, place: str) -> BenchConfig:
        return bench_config("redis", {"redis.url": self.url, "redis.prefix": self.stamp + place},
                            self.variant)

    async def warm(self, adapter: QueueAdapter) -> None:
        assert isinstance(adapter, RedisAdapter)
        await wait_ready(adapter)

    async def cleanup(self, bench: BenchConfig) -> None:
        r = connect(bench.config.redis)
        try:
            await _drop(r, bench.config.redis.prefix)
        finally:
            await r.aclose()

    async def verify(self, bench: BenchConfig) -> None:
        await _check_fenced(bench)

    async def floors(self, bench: BenchConfig, messages: Sequence[Message],
                     count_first: bool = False) -> Floors:
        keys, total = Keys(bench.config.redis.prefix), bench.config.queues.total
        streams, batch = [keys.queue(q) for q in range(total)], bench.variant.batch
        r = connect(bench.config.redis)
        try:
            published = await publish_floor(r, keys, messages, total)
            consumed: dict[bool, Sample] = {}
            for counting in (True, False) if count_first else (False, True):
                consumed[counting] = await consume_floor(
                    r, streams, len(messages), batch or PUBLISH_BATCH, bool(batch),
                    counting=counting, group=COUNT_GROUP if counting else GROUP)
        finally:
            await r.aclose()
        return Floors(published, consumed[False], consumed[True])


async def _check_fenced(bench: BenchConfig) -> None:
    """Fail unless the run leased every queue (so its acks ran the fenced script)."""
    keys, total = Keys(bench.config.redis.prefix), bench.config.queues.total
    r = connect(bench.config.redis)
    try:
        tokens = await r.mget([keys.fence(GROUP, q) for q in range(total)])
        refused = await r.hlen(keys.fenced_acks(GROUP, 0))
    finally:
        await r.aclose()
    unleased = [q for q, t in enumerate(tokens) if t is None]
    if unleased and bench.config.balancer.kind == "dynamic":
        raise BenchmarkError(f"queues {unleased} were never leased: the benchmark did not "
                             "run the shipped (dynamic, fenced) configuration")
    if refused:
        raise BenchmarkError(f"{refused} lease(s) had acknowledgements refused by fencing")


def _spawn_workers(bench: BenchConfig, daemons: int) -> list[subprocess.Popen[bytes]]:
    """``conveyor worker`` processes on the benchmark's file (its changes in the
    environment, as a user would set them)."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "--log-level", "warning", "worker",
             "conveyor.bench.noop_app:app", "--config", str(bench.path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=bench.worker_environment(),
        )
        for _ in range(daemons)
    ]


async def _wait_shared(r: Any, keys: Keys, total: int, daemons: int) -> None:
    lease_keys = [keys.lease(GROUP, q) for q in range(total)]
    deadline = time.monotonic() + LEASED_TIMEOUT_S
    while True:
        held = [v.decode().split(" ", 1)[1] for v in await r.mget(lease_keys) if v]
        owners = set(held)
        if len(held) == total and len(owners) == daemons and all(
            held.count(o) >= total // daemons for o in owners
        ):
            return
        if time.monotonic() > deadline:
            raise BenchmarkError(f"daemons did not share the queues within {LEASED_TIMEOUT_S} s")
        await asyncio.sleep(0.05)  # leases have no event to wait on


async def _processes(backend: RedisBackend, place: str, messages: int, streams: int,
                     daemons: int) -> dict[str, float]:
    """The ``daemons``-process figures (see the module docstring)."""
    bench = backend.config(place)
    adapter = RedisAdapter(bench.config.redis)
    r, keys, total = adapter.redis, adapter.keys, bench.config.queues.total
    client = Client(adapter, HashRingQueueMapper(total))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await client.publish_batch(bench_items(messages, streams))
        for q in range(total):  # parked at the end while the daemons start
            await r.xgroup_create(keys.queue(q), GROUP, "$", mkstream=True)
        clock = SteadyClock()
        procs.extend(_spawn_workers(bench, daemons))
        await _wait_shared(r, keys, total, daemons)
        ps = [psutil.Process(p.pid) for p in procs]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in ps)
        clock.first()
        for q in range(total):
            await r.xgroup_setid(keys.queue(q), GROUP, "0")
        kick = encode_fields(build_messages(bench_items(1, 1), total)[0])
        for q in range(total):  # wakes the blocked readers at once
            await r.xadd(keys.queue(q), kick)
        while True:  # lag has no event to wait on: poll it finely
            if not sum([await adapter.lag(q, GROUP) for q in range(total)]):
                break
            await asyncio.sleep(0.01)
        sample = clock.stop(messages)
        cpu = sum(sum(p.cpu_times()[:2]) for p in ps) - cpu0
        await _check_fenced(bench)
        return {"msgs_per_s": sample.msgs_per_s, "cpu_us_per_msg": cpu / messages * 1e6,
                "startup_s": sample.startup_s}
    finally:
        _stop(procs)
        await _drop(r, bench.config.redis.prefix)
        await adapter.close()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def _measure(backend: RedisBackend, messages: int, streams: int, repeats: int,
                   daemons: tuple[int, ...]) -> dict[str, ThroughputResult]:
    one: list[dict[str, float]] = []
    # The worker processes run the per-message app (conveyor.bench.noop_app): with
    # --batch only the in-process daemon is measured.
    more: dict[int, list[dict[str, float]]] = {
        d: [] for d in daemons if d > 1 and not backend.variant.batch}
    slots, items, single = 0, bench_items(messages, streams), min(messages, SINGLE_MAX)
    for i in range(repeats):
        tag = f"r{i}"
        figures, slots = await repeat_once(backend, items, tag, single, i % 2 == 1)
        one.append(figures)
        floor = {k: v for k, v in figures.items() if k.startswith(("floor_", "count_floor_"))}
        for d, runs in more.items():
            runs.append(floor | await _processes(backend, f"{tag}p{d}", messages, streams, d))
    out = {"1": summarize(backend, one, messages, streams, slots, single)}
    for d, runs in more.items():
        out[str(d)] = replace(summarize(backend, runs, messages, streams, slots), daemons=d)
    return out


def redis_throughput(
    url: str | None, messages: int, streams: int, repeats: int = 3,
    daemons: tuple[int, ...] = (1, 2), variant: Variant | None = None,
) -> dict[str, ThroughputResult]:
    """Results keyed by daemon count ("1" always); a private redis-server when ``url``
    is None."""
    if url is not None:
        return asyncio.run(_measure(RedisBackend(url, variant), messages, streams, repeats,
                                    daemons))
    with private_redis() as private:
        return asyncio.run(_measure(RedisBackend(private, variant), messages, streams,
                                    repeats, daemons))


def as_json(results: dict[str, ThroughputResult]) -> dict[str, Any]:
    """The 1-daemon figures at top level, every daemon count's under ``by_daemons``."""
    first = results["1"]
    return {**first.as_dict(), "by_daemons": {k: v.as_dict() for k, v in results.items()}}
