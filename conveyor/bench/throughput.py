"""No-op throughput as a user gets it, next to raw floors measured in the same run.

``conveyor bench throughput --adapter memory|redis|kafka``: the adapter's shipped config
(:mod:`conveyor.bench.shipped`), N messages over S stream keys, a handler
``async def noop(body: bytes) -> None``. Each repeat measures, one after another:

1. the **publish floor** — the adapter's raw producer writing the same entries (already
   built: ids, bodies, fields) :data:`~conveyor.bench.timing.PUBLISH_BATCH` at a time
   (Kafka has two, interleaved as the consume floors are: see its backend);
2. the two **consume floors**, each reading those entries back with the adapter's raw
   consumer loop, :data:`~conveyor.bench.timing.PUBLISH_BATCH` a read, timed from its
   first record (:class:`~conveyor.bench.timing.SteadyClock`): the **counting loop** only
   counts what each read returns and acknowledges it — the physical limit of a consumer
   on that client — and the **awaiting loop** also awaits the same no-op handler on each
   body, the least a per-message handler adds (``--batch N``: once per read). Every other
   repeat runs the counting loop first;
3. **publish** — ``Client.publish_batch`` of the same items into a fresh place;
4. **consume** — one daemon, built from the config, consuming what 3 published, timed
   from the first delivery to the last acknowledgement
   (:func:`~conveyor.bench.timing.time_daemon`);
5. **consume, /metrics on** — 3 and 4 again in a fresh place with ``[http] port`` set
   (on a free loopback port), as ``conveyor deploy kubernetes`` runs a worker: the
   endpoint served, the meter and its duration histogram on, ``/metrics`` scraped after
   the run (it must count every call). Every other repeat runs it before 4, so drift on
   a loaded machine falls on both alike;
6. **single publish** — ``Client.publish`` one message a call, from concurrent tasks.

Each adapter says what its floors are in a :class:`Backend`; this module runs the
repeats and reduces them to a :class:`~conveyor.bench.figures.ThroughputResult`.
The memory backend is here: its publish floor is the adapter's ``enqueue`` of built
messages, its consume floor a bare ``for`` loop awaiting the handler on each message.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from conveyor.backends import create_adapter
from conveyor.bench import BenchmarkError
from conveyor.bench.figures import ThroughputResult, spreads
from conveyor.bench.shipped import BenchConfig, Variant, bench_config
from conveyor.bench.timing import (
    PUBLISH_BATCH,
    AckCounter,
    Sample,
    SteadyClock,
    bench_items,
    time_daemon,
    time_publish_batch,
    time_publish_single,
)
from conveyor.client import Client, Publish
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.app import App
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message

__all__ = ["AckCounter", "Backend", "Floors", "MemoryBackend", "measure", "memory_throughput",
           "noop", "noop_app", "noop_batch"]

SINGLE_MAX = 20_000
"""Messages of the single-``publish`` run at most (one round trip each without coalescing)."""


def noop_app(counter: list[int]) -> App:
    """A no-op handler of JSON bodies that counts its calls (``conveyor bench telemetry``)."""
    app = App("bench")

    @app.handler("bench")
    async def noop(body: dict[str, Any]) -> None:
        counter[0] += 1

    return app


class Backend(ABC):
    """What a throughput benchmark needs to know of one adapter: where a run's messages
    live (a private place per run), how to open a producer before its timer starts, and
    the two raw loops it is compared with."""

    adapter: str
    floor: str
    """The awaiting consume floor, as printed (``XREADGROUP COUNT 500 + XACK``, the no-op
    awaited on each body)."""
    count_floor: str
    """The counting consume floor, as printed."""
    publish_floor: str
    publish_send_floor = ""
    """The second publish floor, as printed, where the adapter has one (Kafka: ``send``
    per record, :attr:`Floors.publish_send`)."""

    def __init__(self, variant: Variant | None = None) -> None:
        self.variant = variant or Variant()
        self.stamp = f"bench{os.getpid()}x{next(_runs)}"

    @abstractmethod
    def config(self, place: str) -> BenchConfig:
        """The benchmark's config with a private place named ``place`` (prefix/topic)."""

    async def warm(self, adapter: QueueAdapter) -> None:  # noqa: B027 - optional hook
        """Open ``adapter``'s producer connection before a publish is timed."""

    async def cleanup(self, bench: BenchConfig) -> None:  # noqa: B027 - optional hook
        """Delete what runs left in ``bench``'s place."""

    async def verify(self, bench: BenchConfig) -> None:  # noqa: B027 - optional hook
        """Fail if the daemon's run in ``bench``'s place did not run as configured."""

    @abstractmethod
    async def floors(self, bench: BenchConfig, messages: Sequence[Message],
                     count_first: bool = False) -> Floors:
        """Write ``messages`` with the raw producer to ``bench``'s place, then read them
        back twice with the raw consumer (two groups): counting only, and awaiting
        :func:`noop` on each body; the counting read first with ``count_first`` (and a
        second publish floor, where there is one, before the first). Each timed from
        its first record."""


@dataclass(frozen=True)
class Floors:
    """One repeat's raw loops: the publish floor and the two consume floors."""

    publish: Sample
    consume: Sample
    """The awaiting loop: the no-op awaited on each body."""
    count: Sample
    """The counting loop: records counted per read, nothing awaited per record."""
    publish_send: Sample | None = None
    """A second publish floor, where the adapter has one (Kafka: ``send`` per record,
    the client batching as the shipped producer settings say)."""


async def noop(body: bytes) -> None:
    """What the raw loops await per message: the benchmark's handler, undecorated."""
    return None


async def noop_batch(bodies: list[bytes]) -> None:
    """What the raw loops await per batch with ``--batch N``."""
    return None


_runs = itertools.count()


def queue_chunks(messages: Sequence[Message], total: int
                 ) -> list[list[tuple[int, list[Message]]]]:
    """``messages`` cut into :data:`PUBLISH_BATCH` chunks (in order), each grouped by
    queue as ``publish_batch`` groups them: what a raw producer sends per round trip."""
    mapper = HashRingQueueMapper(total)
    chunks = []
    for i in range(0, len(messages), PUBLISH_BATCH):
        by_queue: dict[int, list[Message]] = {}
        for m in messages[i : i + PUBLISH_BATCH]:
            by_queue.setdefault(mapper.queue_for(m.stream), []).append(m)
        chunks.append(list(by_queue.items()))
    return chunks


def build_messages(items: Sequence[Publish], total: int) -> list[Message]:
    """``items`` as the client builds them (ids, timestamps, encoded bodies)."""
    from conveyor.adapters.memory import MemoryAdapter, reset_broker

    name = f"bench-build-{os.getpid()}"
    client = Client(MemoryAdapter(name), HashRingQueueMapper(total))
    reset_broker(name)
    return [client.build(i.namespace, i.key, i.body) for i in items]


async def _publish_into(backend: Backend, bench: BenchConfig,
                        items: Sequence[Publish], single: bool) -> Sample:
    client = Client.from_config(bench.config)  # as a user's producer builds it
    try:
        await backend.warm(client.adapter)
        if single:
            return await time_publish_single(client, items)
        return await time_publish_batch(client, items)
    finally:
        await client.close()


async def _consume(bench: BenchConfig, messages: int) -> tuple[Sample, int]:
    adapter = create_adapter(bench.config.queues.adapter, bench.config)
    try:
        return await time_daemon(bench.config, adapter, messages, bench.variant.batch)
    finally:
        await adapter.close()


def _figures(prefix: str, sample: Sample, startup: bool = True) -> dict[str, float]:
    out = {f"{prefix}msgs_per_s": sample.msgs_per_s,
           f"{prefix}cpu_us_per_msg": sample.cpu_us_per_msg}
    if startup:
        out[f"{prefix}startup_s"] = sample.startup_s
    return out


async def repeat_once(backend: Backend, items: Sequence[Publish], tag: str,
                      single: int, metrics_first: bool = False) -> tuple[dict[str, float], int]:
    """One repeat's figures (see the module docstring) and the daemon's slot count."""
    out: dict[str, float] = {}
    floor_bench = backend.config(f"{tag}f")
    built = build_messages(items, floor_bench.config.queues.total)
    try:
        floors = await backend.floors(floor_bench, built, count_first=metrics_first)
    finally:
        await backend.cleanup(floor_bench)
    out |= _figures("publish_floor_", floors.publish, startup=False)
    if floors.publish_send is not None:
        out |= _figures("publish_send_floor_", floors.publish_send, startup=False)
    out |= _figures("floor_", floors.consume)
    out |= _figures("count_floor_", floors.count)
    slots = 0
    for metrics in (True, False) if metrics_first else (False, True):
        bench = backend.config(f"{tag}{'m' if metrics else 'c'}")
        if metrics:
            bench = with_metrics_endpoint(bench)
        try:
            published = await _publish_into(backend, bench, items, False)
            run, slots = await _consume(bench, len(items))
            await backend.verify(bench)
        finally:
            await backend.cleanup(bench)
        if metrics:
            out |= _figures("metrics_", run)
        else:
            out |= _figures("publish_", published, startup=False) | _figures("", run)
    if single:
        single_bench = backend.config(f"{tag}s")
        try:
            sample = await _publish_into(backend, single_bench, items[:single], True)
        finally:
            await backend.cleanup(single_bench)
        out |= _figures("publish_single_", sample, startup=False)
    return out, slots


def summarize(backend: Backend, runs: Sequence[Mapping[str, float]], messages: int,
              streams: int, slots: int, single: int = 0) -> ThroughputResult:
    bench = backend.config("")
    return ThroughputResult(
        adapter=backend.adapter, variant=backend.variant.name, config=bench.label,
        messages=messages, streams=streams, queues=bench.config.queues.total, slots=slots,
        figures=spreads(runs), repeats=len(runs), floor=backend.floor,
        count_floor=backend.count_floor,
        publish_floor=backend.publish_floor if single else "", single_messages=single,
        publish_send_floor=backend.publish_send_floor if single else "",
    )


def with_metrics_endpoint(bench: BenchConfig) -> BenchConfig:
    """``bench`` with ``[http] port`` set to a free loopback port (``/metrics`` on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = msgspec.structs.replace(bench.config.http, port=port, host="127.0.0.1")
    return replace(bench, config=msgspec.structs.replace(bench.config, http=http))


async def measure(backend: Backend, messages: int, streams: int,
                  repeats: int = 3) -> ThroughputResult:
    items = bench_items(messages, streams)
    single = min(messages, SINGLE_MAX)
    runs = []
    slots = 0
    for i in range(repeats):
        figures, slots = await repeat_once(backend, items, f"r{i}", single, i % 2 == 1)
        runs.append(figures)
    return summarize(backend, runs, messages, streams, slots, single)


class MemoryBackend(Backend):
    adapter = "memory"
    floor = "for loop awaiting the handler"
    count_floor = f"for loop counting the messages, {PUBLISH_BATCH} at a time"
    publish_floor = f"adapter.enqueue of built messages, {PUBLISH_BATCH} at a time"

    def __init__(self, variant: Variant | None = None) -> None:
        super().__init__(variant)
        if self.variant.batch:
            self.floor = f"for loop awaiting the handler once per {self.variant.batch} messages"

    def config(self, place: str) -> BenchConfig:
        from conveyor.adapters.memory import reset_broker

        name = f"{self.stamp}{place}"
        reset_broker(name)
        return bench_config("memory", {"memory.broker": name}, self.variant)

    async def cleanup(self, bench: BenchConfig) -> None:
        from conveyor.adapters.memory import reset_broker

        reset_broker(bench.config.memory.broker)

    async def floors(self, bench: BenchConfig, messages: Sequence[Message],
                     count_first: bool = False) -> Floors:
        adapter = create_adapter("memory", bench.config)
        chunks = queue_chunks(messages, bench.config.queues.total)
        clock = SteadyClock()
        clock.first()
        for chunk in chunks:
            for queue, batch in chunk:
                await adapter.enqueue(queue, batch)
        publish = clock.stop(len(messages))
        if count_first:
            count = _count_loop(messages)
            consume = await self._await_loop(messages, bench.variant.batch)
        else:
            consume = await self._await_loop(messages, bench.variant.batch)
            count = _count_loop(messages)
        return Floors(publish, consume, count)

    @staticmethod
    async def _await_loop(messages: Sequence[Message], size: int) -> Sample:
        clock = SteadyClock()
        clock.first()
        if size:
            for i in range(0, len(messages), size):
                await noop_batch([m.body for m in messages[i : i + size]])
        else:
            for msg in messages:
                await noop(msg.body)
        return clock.stop(len(messages))


def _count_loop(messages: Sequence[Message]) -> Sample:
    clock = SteadyClock()
    clock.first()
    seen = 0
    for i in range(0, len(messages), PUBLISH_BATCH):
        seen += len(messages[i : i + PUBLISH_BATCH])
    if seen != len(messages):
        raise BenchmarkError(f"the counting loop saw {seen} messages, not {len(messages)}")
    return clock.stop(len(messages))


def memory_throughput(messages: int, streams: int, repeats: int = 3,
                      variant: Variant | None = None) -> ThroughputResult:
    return asyncio.run(measure(MemoryBackend(variant), messages, streams, repeats))
