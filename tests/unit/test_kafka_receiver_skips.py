"""A new owner of a Kafka partition skips the offsets its last owner finished above the
committed watermark — also when the first read is handed out only on a second try
(fakes in place of the broker: the failure is one of the hand-off write)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka.handoff import Deliveries
from conveyor.adapters.kafka.receiver import KafkaReceiver
from conveyor.platform.errors import BrokerError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message

TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)


class _Config:
    default_namespace = "ns"


class _Cluster:
    topic = TOPIC
    topic_changed = None
    config = _Config()

    async def wait_topic_ready(self, wait_s: float | None) -> bool:
        return True


class _Coordinator:
    async def fetch_committed_offsets(self, tps: list[TopicPartition]) -> dict[Any, Any]:
        return {TP: OffsetAndMetadata(0, "")}  # metadata dropped, as tansu does


class _Consumer:
    """The group's consumer: reads the partition from its position, ``seek`` moves it."""

    def __init__(self, count: int) -> None:
        self._coordinator = _Coordinator()
        self.records = [Message(f"m{i}", StreamId("ns", f"k{i}"), b"{}",
                                token=SequenceToken(0, i)) for i in range(count)]
        self.position = 0

    async def getmany(self, tp: TopicPartition, timeout_ms: int,
                      max_records: int) -> dict[TopicPartition, list[Message]]:
        batch = self.records[self.position:self.position + max_records]
        self.position += len(batch)
        return {tp: batch}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position = offset

    def highwater(self, tp: TopicPartition) -> int:
        return len(self.records)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)  # nothing deleted


class _Handoffs:
    """The last owner finished offsets 2 and 3 at watermark 0; writes fail ``failures``
    times, then go through."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def read_deliveries(self, group: str, queue: int, watermark: int) -> Deliveries:
        return Deliveries({2, 3}, -1, {})

    async def write(self, *args: Any, **kwargs: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise BrokerError("kafka: the hand-off topic is unreachable")


async def _receiver(write_failures: int) -> KafkaReceiver:
    consumer = _Consumer(6)
    receiver = KafkaReceiver(cast(Any, _Cluster()), cast(Any, _Handoffs(write_failures)),
                             0, "g", shared=cast(Any, consumer))
    await receiver.initialize()
    return receiver


def _offsets(messages: list[Message]) -> list[int]:
    return [m.token.major for m in messages if m.token is not None]


async def test_the_offsets_the_last_owner_finished_are_skipped() -> None:
    receiver = await _receiver(write_failures=0)
    assert _offsets(await receiver.get_messages(10)) == [0, 1, 4, 5]


async def test_a_read_handed_out_on_the_second_try_still_skips_them() -> None:
    """The hand-off write that precedes handing a read out fails: the read goes back
    (the consumer is moved back to its first offset) and the next pull reads it again.
    The done offsets among it stay skipped; they used to run again here."""
    receiver = await _receiver(write_failures=1)
    with pytest.raises(BrokerError):
        await receiver.get_messages(10)
    assert _offsets(await receiver.get_messages(10)) == [0, 1, 4, 5]
