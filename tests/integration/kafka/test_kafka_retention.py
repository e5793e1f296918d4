"""What the broker's retention deletes is reported, never silent: a dead-letter topic with
a finite retention (warned of at a worker's start and by ``status``, ``dlq`` and the
console), and a queue's records deleted before the app handled them (the receiver).

tansu 0.6.0 (memory storage) reports topic settings (DescribeConfigs) but enforces no
retention and does not implement DeleteRecords (its broker task panics, the client's
connection is closed): docs/kafka.md, "What tansu supports"."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.config import load_config
from conveyor.platform.ids import StreamId
from conveyor.platform.message import Message
from tests.conftest import stop_when
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config
from tests.integration.kafka.test_kafka_topic_drift import (
    QUEUES,
    cli,
    config_file,
    handled_ids,
    publish,
    worker,
)

pytestmark = pytest.mark.kafka


async def create_topic(tansu: Tansu, name: str, settings: dict[str, str]) -> None:
    """Topic ``name``, one partition, with ``settings``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs=settings)])
    finally:
        await admin.close()


def retention_lines(topic: str) -> list[str]:
    """What is said of ``TOPIC.conveyor-dlq`` kept a day and ``TOPIC.conveyor-dlq-ops``
    kept to 1 MB (:func:`create_topic` with the settings of the test below)."""
    letters, ops = f"{topic}.conveyor-dlq", f"{topic}.conveyor-dlq-ops"
    return [
        f"kafka topic {letters!r} (dead letters) has retention.ms=86400000: the broker "
        "deletes each letter 1d after it was stored, whether or not anyone read, replayed "
        "or purged it; set retention.ms=-1 (kafka-configs --alter --entity-type topics "
        f"--entity-name {letters} --add-config retention.ms=-1) unless that is meant",
        f"kafka topic {ops!r} (what dlq replay and purge did) has retention.bytes=1048576: "
        "the broker deletes each record once the partition holds more than 1,048,576 "
        "bytes, oldest first, and the letters it purged or replayed, still in "
        f"{letters!r}, are then listed, and replayed, again; set retention.bytes=-1 "
        "(kafka-configs --alter --entity-type topics --entity-name "
        f"{ops} --add-config retention.bytes=-1) unless that is meant",
    ]


async def test_a_dead_letter_topic_with_a_finite_retention_is_warned_of_not_refused(
    tansu: Tansu, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # Conveyor creates both with retention.ms=-1; created beforehand (by hand, by a
    # platform's defaults) with a finite retention, they deleted letters, or the record
    # of purges and replays, without a word.
    await create_topic(tansu, f"{topic}.conveyor-dlq", {"retention.ms": "86400000"})
    await create_topic(tansu, f"{topic}.conveyor-dlq-ops", {"retention.bytes": "1048576"})
    lines = retention_lines(topic)
    config = config_file(tansu, topic, tmp_path)
    app = f"retention-{topic}"
    out = tmp_path / "out.txt"
    proc = worker(config, out, app)  # not refused: an operator may mean it
    ids = await publish(config, "r", 6)
    stderr = await asyncio.to_thread(stop_when, proc, lambda: len(handled_ids(out)) == 6,
                                     60, "the worker to handle 6 messages")
    assert sorted(handled_ids(out)) == sorted(ids)
    said = [line for line in stderr.splitlines() if "retention." in line]
    assert [s.partition("WARNING")[2].partition(": ")[2] for s in said] == lines, stderr
    for args in (["status", "--app", app], ["status"], ["dlq", "list", "--app", app]):
        result = await asyncio.to_thread(cli, *args, "--config", str(config))
        assert result.returncode == 0, (args, result.stderr)
        assert [w for w in result.stderr.splitlines() if "retention." in w] == [
            f"conveyor: warning: {line}" for line in lines], (args, result.stderr)
    # A running worker looks again every minute: said once while the setting stays.
    adapter = KafkaAdapter(load_config(config, environ={}).kafka, QUEUES)
    try:
        with caplog.at_level(logging.WARNING, logger="conveyor.kafka"):
            await adapter.check_server()
            for _ in range(3):
                await adapter.recheck_server()
    finally:
        await adapter.close()
    assert [m for r in caplog.records if "retention." in (m := r.getMessage())] == lines


async def fetch_offsets(receiver: QueueReceiver, n: int) -> list[int]:
    """The offsets of the next ``n`` messages ``receiver`` hands out (acknowledged)."""
    offsets: list[int] = []
    deadline = asyncio.get_running_loop().time() + 20
    while len(offsets) < n:
        assert asyncio.get_running_loop().time() < deadline, offsets
        got = await receiver.get_messages(n - len(offsets), 0.5)
        offsets += [m.token.major for m in got if m.token is not None]
        if got:
            await receiver.acknowledge([m.token for m in got if m.token is not None])
    return offsets


async def test_a_receiver_checks_the_real_log_start_and_reports_no_deletion_where_none_was(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # The loss itself cannot be made on tansu: it enforces no retention and has no
    # DeleteRecords, so its log start stays 0 (the report of a loss is unit-tested:
    # tests/unit/test_kafka_deleted_records.py). What runs here against the broker: the
    # receiver's start compares the group's committed offset (5) with the partition's
    # log start, and a fetch that starts past where the last one ended (the shape of
    # aiokafka's silent reset to the log start) asks for the log start again — both
    # read ListOffsets(earliest) and must say nothing where nothing was deleted.
    config = kafka_config(tansu.bootstrap, topic, kafka={"idempotence": "off"})
    adapter = KafkaAdapter(config.kafka, 1)
    tp = TopicPartition(topic, 0)
    receiver = adapter.create_receiver(0, "kept")
    try:
        await adapter.enqueue(0, messages(0, 20))
        probe = adapter.cluster.new_consumer("kept")
        await probe.start()
        try:
            probe.assign([tp])
            await probe.commit({tp: OffsetAndMetadata(5, "")})
        finally:
            await probe.stop()
        with caplog.at_level(logging.DEBUG, logger="conveyor.kafka"):
            await receiver.initialize()
            assert await fetch_offsets(receiver, 15) == list(range(5, 20))
            await adapter.enqueue(0, messages(20, 10))
            consumer = receiver._consumer  # type: ignore[attr-defined]
            consumer.seek(tp, 25)  # what a reset past offsets 20-24 leaves
            assert await fetch_offsets(receiver, 5) == list(range(25, 30))
    finally:
        await receiver.shutdown()
        await adapter.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if "offsets" in r.getMessage()]
    assert said == [("DEBUG", "queue 0: offsets 20-24 skipped by the fetch are above the "
                     "log start 0: transaction markers or compacted records, not deleted "
                     "ones")]
    assert receiver.records_lost == 0


def messages(first: int, n: int) -> list[Message]:
    return [Message(f"m{i}", StreamId("jobs", f"k{i}"), b"{}") for i in range(first, first + n)]
