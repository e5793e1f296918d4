"""A Kafka queue's records deleted by the broker (retention, DeleteRecords) before the app
handled them are reported, never silent: which offsets count as deleted, and what is
said and counted.

The broker half — the receiver asking the real broker for the log start at its start and
after a fetch that skipped offsets — runs against tansu in
tests/integration/kafka/test_kafka_retention.py; tansu deletes nothing (no retention, no
DeleteRecords), so the loss itself is made here, from the three offsets it is found by."""

from __future__ import annotations

import logging

import pytest

from conveyor.adapters.kafka.cluster import KafkaCluster
from conveyor.adapters.kafka.handoff import HandoffLog
from conveyor.adapters.kafka.receiver import KafkaReceiver, unhandled_deletion
from conveyor.platform.config import KafkaConfig


@pytest.mark.parametrize(("expected", "first_fetched", "log_start", "deleted"), [
    (100, 140, 140, range(100, 140)),  # reset to the log start: everything skipped
    (100, 140, 120, range(100, 120)),  # 120-139: markers or compacted, not records
    (100, 140, 100, range(0)),  # the log starts where the fetch should have: markers
    (100, 140, 90, range(0)),
    (100, 140, 150, range(100, 140)),  # retention moved on since: the fetched were kept
])
def test_only_offsets_below_the_log_start_count_as_deleted(
    expected: int, first_fetched: int, log_start: int, deleted: range
) -> None:
    assert unhandled_deletion(expected, first_fetched, log_start) == deleted


def test_a_deletion_is_logged_with_queue_range_and_count_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = KafkaCluster(KafkaConfig(topic="shop"), 4)
    receiver = KafkaReceiver(cluster, HandoffLog(cluster), 3, "orders", None)
    with caplog.at_level(logging.WARNING, logger="conveyor.kafka"):
        receiver._note_deleted(100, 140, 140)
        receiver._note_deleted(200, 201, 260)
    assert [r.getMessage() for r in caplog.records] == [
        "queue 3 (kafka topic 'shop' partition 3): 40 record(s), offsets 100-139, were "
        "deleted by the broker (retention, or DeleteRecords) before app 'orders' handled "
        "them; the partition's log starts at offset 140",
        "queue 3 (kafka topic 'shop' partition 3): 1 record(s), offsets 200-200, were "
        "deleted by the broker (retention, or DeleteRecords) before app 'orders' handled "
        "them; the partition's log starts at offset 260",
    ]
    assert receiver.records_lost == 41
