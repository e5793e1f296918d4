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
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.platform.config import load_config
from tests.conftest import stop_when
from tests.integration.kafka.conftest import Tansu
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
