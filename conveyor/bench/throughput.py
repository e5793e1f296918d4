"""End-to-end no-op throughput, next to a floor measured in the same run.

The pipeline figure: N messages are enqueued first (not timed), then one daemon is
started and timed until its receivers have acknowledged all N (the backend's ack call
returned) — pull, cache, lanes, decode, handler, ack. The floor: the same messages
decoded by the same handler declaration and awaited in a bare ``for`` loop — the least
any worker could do. ``ratio = msgs_per_s / floor_msgs_per_s``. Each figure is the
median of ``repeats``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.platform.adapter import QueueAdapter, QueueReceiver
from conveyor.platform.app import App
from conveyor.platform.client import Client
from conveyor.platform.config import Config
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import WorkerDaemon


@dataclass(frozen=True)
class ThroughputResult:
    adapter: str
    messages: int
    streams: int
    msgs_per_s: float
    cpu_us_per_msg: float
    floor_msgs_per_s: float
    floor_cpu_us_per_msg: float
    ratio: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        return "\n".join(
            [
                f"adapter={self.adapter} messages={self.messages} streams={self.streams}",
                f"{'':12}{'msgs/s':>12}{'CPU us/msg':>12}",
                f"{'conveyor':12}{self.msgs_per_s:>12,.0f}{self.cpu_us_per_msg:>12.2f}",
                f"{'floor':12}{self.floor_msgs_per_s:>12,.0f}{self.floor_cpu_us_per_msg:>12.2f}",
                f"ratio (conveyor / floor) = {self.ratio:.3f}",
            ]
        )


def noop_app(counter: list[int]) -> App:
    """A no-op handler that counts the messages it sees in ``counter[0]``."""
    app = App("bench")

    @app.handler("bench")
    async def noop(body: dict[str, Any]) -> None:
        counter[0] += 1

    return app


class AckCounter:
    """Sets :attr:`done` once an adapter's receivers have acknowledged ``target`` messages.

    It wraps ``messages_delivered`` of every receiver the adapter creates, so a timer
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
            deliver = receiver.messages_delivered

            async def delivered(tokens: Sequence[SequenceToken]) -> None:
                await deliver(tokens)
                self.acked += len(tokens)
                if self.acked >= self.target:
                    self.done.set()

            receiver.messages_delivered = delivered  # type: ignore[method-assign]
            return receiver

        adapter.create_receiver = create_counted  # type: ignore[method-assign]


def _messages(client: Client, n: int, streams: int) -> list[Message]:
    return [client.build("bench", f"s{i % streams}", {"i": i, "pad": "x" * 32}) for i in range(n)]


async def _floor(messages: list[Message]) -> tuple[float, float]:
    counter = [0]
    spec = noop_app(counter).handlers[0]
    decode, fn = spec.decode, spec.fn
    t0, c0 = time.perf_counter(), time.process_time()
    for msg in messages:
        await fn(decode(msg))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert counter[0] == len(messages)
    return len(messages) / wall, cpu / len(messages) * 1e6


async def _pipeline(
    make_adapter: Callable[[], QueueAdapter],
    config: Config,
    n: int,
    streams: int,
    telemetry: Telemetry | None = None,
) -> tuple[float, float]:
    counter = [0]
    adapter = make_adapter()
    acks = AckCounter(adapter, n)
    daemon = WorkerDaemon(noop_app(counter), config, adapter=adapter, telemetry=telemetry)
    client = Client(adapter, daemon.mapper)
    msgs = _messages(client, n, streams)
    by_queue: dict[int, list[Message]] = {}
    for m in msgs:
        by_queue.setdefault(daemon.mapper.queue_for(m.stream), []).append(m)
    for queue, batch in by_queue.items():
        await adapter.enqueue(queue, batch)
    t0, c0 = time.perf_counter(), time.process_time()
    await daemon.start()
    await asyncio.wait_for(acks.done.wait(), timeout=300)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    report = await daemon.stop()
    assert report.acked == n == acks.acked == counter[0], (report, acks.acked, counter[0])
    return n / wall, cpu / n * 1e6


async def measure(
    make_adapter: Callable[[], QueueAdapter],
    config: Config,
    *,
    adapter_name: str,
    messages: int,
    streams: int,
    repeats: int = 3,
    telemetry: Telemetry | None = None,
) -> ThroughputResult:
    runs = [
        await _pipeline(make_adapter, config, messages, streams, telemetry)
        for _ in range(repeats)
    ]
    probe = Client(make_adapter(), HashRingQueueMapper(config.queues.total))
    floor_msgs = _messages(probe, messages, streams)
    floors = [await _floor(floor_msgs) for _ in range(repeats)]
    rate = statistics.median(r for r, _ in runs)
    floor_rate = statistics.median(r for r, _ in floors)
    return ThroughputResult(
        adapter=adapter_name,
        messages=messages,
        streams=streams,
        msgs_per_s=rate,
        cpu_us_per_msg=statistics.median(c for _, c in runs),
        floor_msgs_per_s=floor_rate,
        floor_cpu_us_per_msg=statistics.median(c for _, c in floors),
        ratio=rate / floor_rate,
    )


def memory_throughput(messages: int, streams: int, repeats: int = 3) -> ThroughputResult:
    from conveyor.adapters.memory import MemoryAdapter, reset_broker

    counter = [0]

    def make() -> QueueAdapter:
        counter[0] += 1
        name = f"bench-{counter[0]}"
        reset_broker(name)
        return MemoryAdapter(name)

    config = Config()
    return asyncio.run(
        measure(make, config, adapter_name="memory", messages=messages, streams=streams,
                repeats=repeats)
    )

