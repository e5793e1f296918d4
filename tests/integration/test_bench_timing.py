"""The throughput benchmark's timing rules: every consumer — Conveyor and the raw loops —
is timed from its first record to its last acknowledgement, start-up is reported apart,
and the config that ran is the shipped file (or a variant that says so)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from click.testing import CliRunner

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.codec import message_headers
from conveyor.adapters.kafka.connection import client_options
from conveyor.adapters.memory import MemoryAdapter, MemoryReceiver, reset_broker
from conveyor.adapters.redis.keys import Keys
from conveyor.bench import kafka_throughput, redis_throughput
from conveyor.bench.shipped import Variant, bench_config, shipped_path
from conveyor.bench.throughput import MemoryBackend, build_messages, measure
from conveyor.bench.timing import Sample, bench_items, time_daemon
from conveyor.cli import main
from conveyor.client import Client
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.config import Config, load_config
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message
from tests.servers import RedisServer, Tansu

ACK_DELAY_S = 0.5
SETUP_DELAY_S = 1.0
N = 400


class SlowAckReceiver(MemoryReceiver):
    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        await asyncio.sleep(ACK_DELAY_S)  # the injected fault: a backend slow to ack
        await super().acknowledge(tokens)


class SlowAckAdapter(MemoryAdapter):
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        return SlowAckReceiver(self.broker, queue, group)


class SlowFirstPullReceiver(MemoryReceiver):
    """Each queue's first pull takes SETUP_DELAY_S: a daemon slow to reach its broker."""

    pulled = False

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        if not self.pulled:
            self.pulled = True
            await asyncio.sleep(SETUP_DELAY_S)
        return await super().get_messages(max_count, timeout_s)


class SlowFirstPullAdapter(MemoryAdapter):
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        return SlowFirstPullReceiver(self.broker, queue, group)


async def _published(adapter: MemoryAdapter, config: Config) -> MemoryAdapter:
    client = Client(adapter, HashRingQueueMapper(config.queues.total))
    await client.publish_batch(bench_items(N, 20))
    return adapter


def _timed_after_setup(sample: Sample) -> None:
    """The set-up delay is start-up, and none of it is in the figure."""
    assert sample.startup_s >= SETUP_DELAY_S
    assert N / sample.msgs_per_s < SETUP_DELAY_S


async def test_the_conveyor_timer_waits_for_every_ack() -> None:
    reset_broker("slow-ack")
    config = Config()
    adapter = await _published(SlowAckAdapter("slow-ack"), config)
    sample, _ = await time_daemon(config, adapter, N)
    # Every ack takes ACK_DELAY_S, so no run can finish faster than that; a timer that
    # stopped when the handler had seen N messages would report thousands per second.
    assert sample.msgs_per_s <= N / ACK_DELAY_S


async def test_the_conveyor_timer_starts_at_the_first_delivery() -> None:
    reset_broker("slow-start")
    config = Config()
    adapter = await _published(SlowFirstPullAdapter("slow-start"), config)
    sample, _ = await time_daemon(config, adapter, N)
    _timed_after_setup(sample)


async def test_the_shipped_config_is_what_runs_whatever_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVEYOR_SLOTS__COUNT", "3")  # a user's shell must not leak in
    shipped = load_config(shipped_path("memory"), environ={})
    result = await measure(MemoryBackend(), N, streams=20, repeats=1)
    assert (result.variant, result.config) == ("shipped", "configs/local.toml")
    assert result.slots == shipped.slots.count
    assert result.queues == shipped.queues.total


async def test_a_variant_runs_its_slot_count_and_is_named_in_the_output() -> None:
    variant = Variant.of(["worker.max_batch=500"], slots=8)
    result = await measure(MemoryBackend(variant), N, streams=20, repeats=1)
    assert result.slots == 8
    assert result.variant == "worker.max_batch=500, slots.count=8"
    assert result.as_dict()["variant"] == result.variant


def test_only_where_it_runs_differs_from_the_shipped_file() -> None:
    shipped = load_config(shipped_path("redis"), environ={})
    bench = bench_config("redis", {"redis.url": "redis://127.0.0.1:1/0",
                                   "redis.prefix": "benchx"})
    assert bench.config.redis.url == "redis://127.0.0.1:1/0"
    assert bench.config.redis.prefix == "benchx"
    assert bench.config.slots == shipped.slots
    assert bench.config.worker == shipped.worker
    assert bench.config.balancer == shipped.balancer
    assert bench.worker_environment()["CONVEYOR_REDIS__PREFIX"] == '"benchx"'


class SlowConnection(aioredis.Connection):
    """Connecting takes SETUP_DELAY_S: a raw consumer slow to start."""

    async def connect(self) -> None:
        if not self.is_connected:
            await asyncio.sleep(SETUP_DELAY_S)
        await super().connect()


@pytest.mark.redis
async def test_the_redis_floor_timer_starts_at_its_first_reply(redis_server: RedisServer) -> None:
    keys, total = Keys("floor"), 4
    fast = aioredis.from_url(redis_server.url)
    pool = aioredis.ConnectionPool.from_url(redis_server.url, connection_class=SlowConnection)
    slow = aioredis.Redis(connection_pool=pool)
    try:
        await redis_throughput.publish_floor(fast, keys, build_messages(bench_items(N, 20), total),
                                             total)
        sample = await redis_throughput.consume_floor(
            slow, [keys.queue(q) for q in range(total)], N)
    finally:
        await slow.aclose()
        await fast.aclose()
    _timed_after_setup(sample)


class SlowStartConsumer(AIOKafkaConsumer):  # type: ignore[misc]
    async def start(self) -> None:
        await asyncio.sleep(SETUP_DELAY_S)
        await super().start()


PublishFloor = Callable[[AIOKafkaProducer, str, Sequence[Message], int], Awaitable[Sample]]


async def _write_with(floor: PublishFloor, tansu: Tansu, topic: str, total: int,
                      messages: Sequence[Message]) -> Sample:
    """``floor`` (a Kafka publish floor) writing ``messages`` to a new ``topic`` of
    ``total`` partitions, through a plain producer."""
    cfg = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": total},
        "kafka": {"bootstrap": tansu.bootstrap, "topic": topic}}).kafka
    adapter = KafkaAdapter(cfg, total)
    await adapter.ensure_topic()
    await adapter.close()
    producer = AIOKafkaProducer(**client_options(cfg))
    await producer.start()
    try:
        return await floor(producer, topic, messages, total)
    finally:
        await producer.stop()


@pytest.mark.kafka
async def test_the_kafka_floor_timer_starts_at_its_first_record(tansu: Tansu) -> None:
    topic, total = f"floor-{uuid.uuid4().hex[:8]}", 4
    await _write_with(kafka_throughput.publish_floor, tansu, topic, total,
                      build_messages(bench_items(N, 20), total))
    consumer = SlowStartConsumer(bootstrap_servers=tansu.bootstrap, group_id=f"{topic}-raw",
                                 enable_auto_commit=False, auto_offset_reset="earliest")
    _timed_after_setup(await kafka_throughput.consume_floor(consumer, topic, total, N))


@pytest.mark.kafka
async def test_the_kafka_send_floor_writes_what_publish_batch_writes(tansu: Tansu) -> None:
    """The per-record publish floor sends each record where ``publish_batch`` sends its
    message, with the key, headers and timestamp the adapter writes."""
    topic, total = f"send-{uuid.uuid4().hex[:8]}", 4
    messages = build_messages(bench_items(N, 20), total)
    sample = await _write_with(kafka_throughput.publish_send_floor, tansu, topic, total,
                               messages)
    assert sample.msgs_per_s > 0 and sample.cpu_us_per_msg > 0
    mapper = HashRingQueueMapper(total)
    wanted: dict[int, list[tuple[Any, ...]]] = {q: [] for q in range(total)}
    for m in messages:
        wanted[mapper.queue_for(m.stream)].append(
            (m.stream.key.encode(), m.body, tuple(message_headers(m)), m.enqueued_at_ms))
    consumer = AIOKafkaConsumer(bootstrap_servers=tansu.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, q) for q in range(total)])
        await consumer.seek_to_beginning()
        got: dict[int, list[tuple[Any, ...]]] = {q: [] for q in range(total)}
        while sum(map(len, got.values())) < N:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                got[tp.partition] += [(r.key, r.value, tuple(r.headers), r.timestamp)
                                      for r in records]
    finally:
        await consumer.stop()
    assert got == wanted


def _bench_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["bench", "throughput", "--messages", str(N),
                                       "--streams", "20", "--repeats", "1", "--json", *args])
    assert result.exit_code == 0, result.output
    figures: dict[str, Any] = json.loads(result.output)
    return figures


def _assert_comparable(figures: dict[str, Any], adapter: str) -> None:
    shipped = load_config(shipped_path(adapter), environ={})
    assert (figures["variant"], figures["slots"]) == ("shipped", shipped.slots.count)
    assert figures["queues"] == shipped.queues.total
    for key in ("msgs_per_s", "cpu_us_per_msg", "startup_s", "floor_msgs_per_s",
                "count_floor_msgs_per_s", "count_floor_cpu_us_per_msg",
                "publish_msgs_per_s", "publish_floor_msgs_per_s", "publish_single_msgs_per_s"):
        assert figures[key] > 0, key
    assert figures["ratio"] == pytest.approx(figures["msgs_per_s"] / figures["floor_msgs_per_s"])
    # Both floors, measured in the same run: the counting loop and the awaiting loop.
    assert figures["count_ratio"] == pytest.approx(
        figures["msgs_per_s"] / figures["count_floor_msgs_per_s"])
    assert figures["count_floor"] and figures["floor"] != figures["count_floor"]
    assert figures["publish_ratio"] == pytest.approx(
        figures["publish_msgs_per_s"] / figures["publish_floor_msgs_per_s"])
    # The same daemon with [http] port set (its /metrics scraped and checked after the run)
    for key in ("metrics_msgs_per_s", "metrics_cpu_us_per_msg"):
        assert figures[key] > 0, key
    assert figures["metrics_ratio"] == pytest.approx(
        figures["metrics_msgs_per_s"] / figures["msgs_per_s"])
    assert figures["metrics_cpu_ratio"] == pytest.approx(
        figures["cpu_us_per_msg"] / figures["metrics_cpu_us_per_msg"])


def test_the_memory_benchmark_prints_metrics_on_next_to_metrics_off() -> None:
    result = CliRunner().invoke(main, ["bench", "throughput", "--messages", str(N),
                                       "--streams", "20", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "conveyor, /metrics on" in result.output
    assert "ratio (/metrics on / off)" in result.output
    assert "CPU ratio (off / on)" in result.output
    figures = _bench_json("--adapter", "memory")
    _assert_comparable(figures, "memory")
    assert "publish_send_floor_msgs_per_s" not in figures  # one publish floor, no second


@pytest.mark.redis
def test_the_redis_benchmark_runs_the_shipped_file_next_to_both_floors(
    redis_server: RedisServer,
) -> None:
    figures = _bench_json("--adapter", "redis", "--redis-url", redis_server.url,
                          "--daemons", "1")
    _assert_comparable(figures, "redis")


@pytest.mark.redis
async def test_the_redis_counting_floor_reads_every_entry_in_its_own_group(
    redis_server: RedisServer,
) -> None:
    keys, total = Keys(f"count{uuid.uuid4().hex[:6]}"), 4
    r = aioredis.from_url(redis_server.url)
    try:
        await redis_throughput.publish_floor(r, keys, build_messages(bench_items(N, 20), total),
                                             total)
        streams = [keys.queue(q) for q in range(total)]
        await redis_throughput.consume_floor(r, streams, N)
        # The same entries again, counted: the awaiting loop's acks do not hide them.
        sample = await redis_throughput.consume_floor(r, streams, N, counting=True,
                                                      group=redis_throughput.COUNT_GROUP)
    finally:
        await r.aclose()
    assert sample.msgs_per_s > 0


@pytest.mark.kafka
def test_the_kafka_benchmark_runs_the_shipped_file_next_to_its_floors(tansu: Tansu) -> None:
    figures = _bench_json("--adapter", "kafka", "--bootstrap", tansu.bootstrap,
                          "--io-messages", "0")
    _assert_comparable(figures, "kafka")
    assert figures["bootstrap"] == tansu.bootstrap
    # Both publish floors, measured in the same run: send_batch of closed batches, and
    # send per record at the shipped producer settings (the floor of issue 24).
    for key in ("publish_send_floor_msgs_per_s", "publish_send_floor_cpu_us_per_msg",
                "publish_send_ratio"):
        assert 0 < figures[key] < float("inf"), key
        low, high = figures["spread"][key]
        assert low <= figures[key] <= high, key
    assert figures["publish_send_ratio"] == pytest.approx(
        figures["publish_msgs_per_s"] / figures["publish_send_floor_msgs_per_s"])
    linger = load_config(shipped_path("kafka"), environ={}).kafka.linger_ms
    assert f"linger_ms {linger}" in figures["publish_send_floor"]
    assert figures["publish_floor"] != figures["publish_send_floor"]
