"""How the throughput benchmarks time Conveyor and the raw loops: at steady state.

Every consumer is timed the same way, by a :class:`SteadyClock`: start-up — connecting,
joining a group, leasing queues, the first fetch — runs from the clock's creation to
its first record (reported apart, as ``startup_s``), and the figure runs from the first
record to the last acknowledgement. So a raw loop and Conveyor are compared on what
they do per message, not on how long their clients take to connect.

* Conveyor (:func:`time_daemon`): N messages are published first; a
  :class:`WorkerDaemon` is built from the benchmark's config, started, and its startup
  heap frozen as ``conveyor worker`` does; the clock starts at the first delivery (the
  no-op handler's first call) and stops when the receivers' acknowledgements for all N
  have returned (:class:`AckCounter`: the broker has them). With ``[http] port`` set it
  serves ``/metrics`` and the probes as ``conveyor worker`` does, and ``/metrics`` is
  scraped once after the run: it must count all N handler calls.
* Producers (:func:`time_publish_batch`, :func:`time_publish_single`): a client whose
  connection is already open publishes N messages, ``publish_batch`` of
  :data:`PUBLISH_BATCH` at a time, or single ``publish`` calls from
  :data:`PUBLISHERS` concurrent tasks (each stream's messages from one task, in order).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from conveyor.bench import BenchmarkError
from conveyor.client import Client, Publish
from conveyor.platform.adapter import QueueAdapter, QueueReceiver
from conveyor.platform.app import App
from conveyor.platform.config import Config
from conveyor.platform.ids import SequenceToken
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.http_endpoint import daemon_endpoint

PUBLISH_BATCH = 500
"""Messages per ``publish_batch`` call, and per pipeline / batch of the raw producers."""
PUBLISHERS = 100
"""Concurrent tasks calling ``publish`` one message at a time."""
RUN_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sample:
    """One timed run: messages per second and CPU per message over the timed window
    (from the first record), and the start-up before it."""

    msgs_per_s: float
    cpu_us_per_msg: float
    startup_s: float


class SteadyClock:
    """Start-up runs from construction to :meth:`first`; the timed window from there to
    :meth:`stop`. :meth:`first` is idempotent and cheap: a consumer calls it on every
    batch (or every message) and only the first call counts."""

    def __init__(self) -> None:
        self.created = time.perf_counter()
        self.started: float | None = None
        self._cpu = 0.0

    def first(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()
            self._cpu = time.process_time()

    def stop(self, messages: int) -> Sample:
        wall, cpu = time.perf_counter(), time.process_time()
        if self.started is None:
            raise BenchmarkError("the run ended before its first record arrived")
        return Sample(messages / (wall - self.started), (cpu - self._cpu) / messages * 1e6,
                      self.started - self.created)


class AckCounter:
    """Sets :attr:`done` once an adapter's receivers have acknowledged ``target`` messages.

    It wraps ``acknowledge`` of every receiver the adapter creates, so a timer
    stops on the acknowledgement itself, not when the handler returns (acks are sent
    after, in batches). One extra call per ack batch, none per message.
    """

    def __init__(self, adapter: QueueAdapter, target: int) -> None:
        self.acked = 0
        self.target = target
        self.done = asyncio.Event()
        create = adapter.create_receiver

        def create_counted(queue: int, group: str) -> QueueReceiver:
            receiver = create(queue, group)
            deliver = receiver.acknowledge

            async def delivered(tokens: Sequence[SequenceToken]) -> None:
                await deliver(tokens)
                self.acked += len(tokens)
                if self.acked >= self.target:
                    self.done.set()

            receiver.acknowledge = delivered  # type: ignore[method-assign]
            return receiver

        adapter.create_receiver = create_counted  # type: ignore[method-assign]


def first_delivery_app(clock: SteadyClock, counter: list[int], batch: int = 0) -> App:
    """The benchmark's app: ``async def noop(body: bytes) -> None`` on namespace
    ``bench``, which also starts ``clock`` on its first call and counts its calls (with
    ``batch``, ``async def noop(bodies: list[bytes])``, ``batch_size=batch``, counting
    the bodies)."""
    app = App("bench")
    first = clock.first
    if batch:
        @app.handler("bench", batch_size=batch)
        async def noop_batch(bodies: list[bytes]) -> None:
            if not counter[0]:
                first()
            counter[0] += len(bodies)

        return app

    @app.handler("bench")
    async def noop(body: bytes) -> None:
        if not counter[0]:
            first()
        counter[0] += 1

    return app


def bench_items(messages: int, streams: int) -> list[Publish]:
    """The messages every run publishes: ``messages`` small JSON bodies over ``streams``
    keys of namespace ``bench``, round robin."""
    return [Publish("bench", f"s{i % streams}", {"i": i, "pad": "x" * 32})
            for i in range(messages)]


async def time_daemon(config: Config, adapter: QueueAdapter, messages: int,
                      batch: int = 0) -> tuple[Sample, int]:
    """Consume ``messages`` already on ``adapter``'s queues with one daemon built from
    ``config`` (a batch handler of ``batch`` when not 0); returns the sample and the
    slot count the daemon was built with.

    The adapter is the daemon's (it is not closed here: the caller owns it).
    """
    clock, counter = SteadyClock(), [0]  # start-up counts from building the daemon
    acks = AckCounter(adapter, messages)
    daemon = WorkerDaemon(first_delivery_app(clock, counter, batch), config, adapter=adapter)
    slots = daemon.config.slots.count
    endpoint = None
    if config.http.port is not None:  # as `conveyor worker` serves it
        endpoint = daemon_endpoint(daemon, config.http.host, config.http.port)
        await endpoint.start()
    try:
        await daemon.start(freeze_heap=True)  # as `conveyor worker` starts its daemon
        await asyncio.wait_for(acks.done.wait(), timeout=RUN_TIMEOUT_S)
        sample = clock.stop(messages)
        if endpoint is not None:  # a batch handler's calls are not in the histogram
            await _check_scraped(endpoint.host, endpoint.port, 0 if batch else messages)
    finally:
        report = await daemon.stop()
        gc.unfreeze()
        if endpoint is not None:
            await endpoint.close()
    if not report.acked == messages == acks.acked == counter[0]:
        raise BenchmarkError(f"the daemon did not handle exactly {messages} messages once: "
                             f"{report}, {acks.acked} acknowledged, {counter[0]} handled")
    return sample, slots


async def _check_scraped(host: str, port: int, messages: int) -> None:
    """``GET /metrics`` once, after the run: it must have counted ``messages`` handler
    calls in its duration histogram."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        await writer.drain()
        body = (await reader.read()).decode().partition("\r\n\r\n")[2]
    finally:
        writer.close()
    counted = sum(s.value for family in text_string_to_metric_families(body)
                  for s in family.samples if s.name == "conveyor_handler_duration_seconds_count")
    if counted != messages:
        raise BenchmarkError(f"/metrics counted {counted} handler calls, not {messages}")


async def time_publish_batch(client: Client, items: Sequence[Publish]) -> Sample:
    """``client.publish_batch`` of :data:`PUBLISH_BATCH` messages at a time, in order."""
    clock = SteadyClock()
    clock.first()
    for i in range(0, len(items), PUBLISH_BATCH):
        await client.publish_batch(items[i : i + PUBLISH_BATCH])
    return clock.stop(len(items))


async def time_publish_single(client: Client, items: Sequence[Publish]) -> Sample:
    """``client.publish`` of one message per call from :data:`PUBLISHERS` tasks; a
    stream's messages all come from one task, in order."""
    lanes: list[list[Publish]] = [[] for _ in range(PUBLISHERS)]
    for item in items:
        lanes[hash(item.key) % PUBLISHERS].append(item)

    async def publish(lane: list[Publish]) -> None:
        for item in lane:
            await client.publish(item.namespace, item.key, item.body)

    clock = SteadyClock()
    clock.first()
    await asyncio.gather(*(publish(lane) for lane in lanes))
    return clock.stop(len(items))
