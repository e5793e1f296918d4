"""Kafka's size limit is a setting (``[kafka] max_request_size``), checked before anything
is sent; a batch with one partition refused says what landed, and the rest goes once.

tansu stores records of any size (tried up to 30 MiB), so the broker's own size refusal
(``message.max.bytes``) cannot be provoked here: across partitions, the one that fails is
the one whose record is over the client's limit, refused before it is sent. Within a
partition, the broker refuses one record batch for real: tansu's schema registry
refuses a batch whose values do not match the topic's JSON schema, and stores the
batches before and after it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from conveyor.client import Client, Publish
from conveyor.platform.errors import (
    BrokerError,
    InvalidArgumentError,
    MessageTooLargeError,
    PartialPublishError,
    PublishUncertain,
)
from tests.conftest import free_port
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config, read_all
from tests.integration.kafka.test_kafka_publish import QUEUES
from tests.servers.tansu import require_tansu

pytestmark = pytest.mark.kafka

MIB = 1 << 20


def seqs_of(records: list[object]) -> Counter[int]:
    return Counter(msgspec.json.decode(r.value)["seq"] for r in records)  # type: ignore[attr-defined]


async def test_a_record_over_max_request_size_is_refused_before_anything_is_sent(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES})
    assert config.kafka.max_request_size == MIB  # Kafka's producer default
    big = {"seq": 1, "pad": "x" * MIB}
    async with Client.from_config(config) as client:
        with pytest.raises(MessageTooLargeError) as caught:
            await client.publish("orders", "k", big)
        text = str(caught.value)
        assert "$.kafka.max_request_size (1048576)" in text and "message.max.bytes" in text
        assert "nothing was sent" in text and "\n" not in text
        batch = [Publish("orders", "k", {"seq": i}) for i in range(2, 50)]  # one partition
        batch.insert(10, Publish("orders", "k", big))
        with pytest.raises(MessageTooLargeError):
            await client.publish_batch(batch)
        await client.publish("orders", "k", {"seq": 0})  # what the topic should hold, alone
    assert seqs_of(await read_all(tansu.bootstrap, topic, 1, QUEUES)) == {0: 1}


async def test_a_key_of_a_megabyte_is_refused_in_one_short_line(
    tansu: Tansu, topic: str
) -> None:
    # The error named the stream in full: a key of a megabyte made a line of a megabyte.
    # (Such a record was refused by its size; a key past 1,024 characters is refused
    # before any encoding now, on every backend.)
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES})
    key = "K" * MIB
    async with Client.from_config(config) as client:
        with pytest.raises(InvalidArgumentError) as caught:
            await client.publish("orders", key, {"seq": 1})
        await client.publish("orders", "k", {"seq": 0})
    text = str(caught.value)
    assert f"'orders'/'{'K' * 100}'… (1,048,576 characters): its stream key is longer" in text, (
        text[:400])
    assert len(text) < 400 and "nothing was sent" in text, text[:400]
    assert seqs_of(await read_all(tansu.bootstrap, topic, 1, QUEUES)) == {0: 1}


async def test_a_body_over_max_body_bytes_is_refused_on_kafka_too(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES,
                                                          "max_body_bytes": 1000})
    async with Client.from_config(config) as client:
        with pytest.raises(MessageTooLargeError, match=r"\$\.queues\.max_body_bytes \(1000\)"):
            await client.publish("orders", "k", b"x" * 1001)
        with pytest.raises(MessageTooLargeError):  # the whole batch, its small ones too
            await client.publish_batch([Publish("orders", f"k{i}", b"x" * (1001 if i == 3 else 10))
                                        for i in range(8)])
        await client.publish("orders", "k", {"seq": 0})
    assert seqs_of(await read_all(tansu.bootstrap, topic, 1, QUEUES)) == {0: 1}


async def test_a_raised_max_request_size_lets_large_bodies_through_intact(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES},
                          kafka={"max_request_size": 4 * MIB})
    async with Client.from_config(config) as client:
        await client.publish("orders", "k", {"seq": 0, "pad": "a" * (2 * MIB)})
        await client.publish_batch([Publish("orders", "k", {"seq": i, "pad": "b" * (2 * MIB)})
                                    for i in (1, 2)])
    records = await read_all(tansu.bootstrap, topic, 3, QUEUES)
    assert seqs_of(records) == {0: 1, 1: 1, 2: 1}
    assert sorted(len(r.value) for r in records)[0] > 2 * MIB


async def test_a_batch_with_one_partition_refused_names_what_landed_and_the_rest_goes_once(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES})
    batch = [Publish("orders", f"k{i % 64}", {"seq": i}) for i in range(400)]
    batch.append(Publish("orders", "big", {"seq": 400, "pad": "x" * MIB}))
    async with Client.from_config(config) as client:
        refused = client.queue_for("orders", "big")
        on_refused = [i for i, p in enumerate(batch)
                      if client.queue_for("orders", p.key) == refused]
        with pytest.raises(PartialPublishError) as caught:
            await client.publish_batch(batch)
    err = caught.value
    assert {err.ids[i] for i in on_refused} == set(err.failed)  # that partition's, all of them
    assert all(isinstance(c, MessageTooLargeError) for c in err.failed.values())
    assert not err.uncertain and len(err.published) == len(batch) - len(on_refused) > 0
    assert {t.queue for t in err.published.values()} == set(range(QUEUES)) - {refused}
    landed = await read_all(tansu.bootstrap, topic, len(err.published), QUEUES)
    assert sorted(dict(r.headers)["cv-id"].decode() for r in landed) == sorted(err.published)

    rest = err.not_published(batch)
    assert rest == [batch[i] for i in on_refused]
    bigger = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES},
                          kafka={"max_request_size": 4 * MIB})
    async with Client.from_config(bigger) as client:  # the limit raised, the rest again
        await client.publish_batch(rest)
    everything = await read_all(tansu.bootstrap, topic, len(batch), QUEUES)
    assert seqs_of(everything) == Counter(range(len(batch)))  # each once: none lost or doubled


SEQ_IS_A_NUMBER = (
    '{"type": "object", "properties": {"value": {"type": "object",'
    ' "properties": {"seq": {"type": "integer"}}, "required": ["seq"]}}}'
)


@pytest.fixture
def validating(tmp_path: Path) -> Iterator[Tansu]:
    """A broker validating each topic's values against ``tmp_path/<topic>.json``."""
    # tansu reads a file:// registry path from its working directory: run it from /.
    broker = Tansu(require_tansu(), free_port(), tmp_path / "tansu.log",
                   options=("--schema-registry", f"file://{tmp_path}"), cwd="/")
    broker.start()
    yield broker
    broker.stop()


async def test_a_batch_the_broker_refuses_mid_partition_is_named_and_the_rest_goes_once(
    validating: Tansu, topic: str, tmp_path: Path
) -> None:
    (tmp_path / f"{topic}.json").write_text(SEQ_IS_A_NUMBER)
    config = kafka_config(validating.bootstrap, topic, queues={"total": QUEUES})
    pad = "x" * 6000  # two records per record batch (16 KiB): [0 1] [2 3] [4 5] [6 7]
    batch = [Publish("orders", "k", {"seq": i, "pad": pad}) for i in range(8)]
    batch[4] = Publish("orders", "k", {"seq": "four", "pad": pad})  # the schema refuses it
    async with Client.from_config(config) as client:
        with pytest.raises(PartialPublishError) as caught:
            await client.publish_batch(batch)
    err = caught.value
    assert list(err.failed) == [err.ids[4], err.ids[5]]  # the third batch, whole
    assert all(isinstance(c, BrokerError) and not isinstance(c, PublishUncertain)
               for c in err.failed.values())
    assert sorted(err.published) == sorted(err.ids[i] for i in (0, 1, 2, 3, 6, 7))
    landed = await read_all(validating.bootstrap, topic, len(err.published), QUEUES)
    assert sorted(dict(r.headers)["cv-id"].decode() for r in landed) == sorted(err.published)

    rest = err.not_published(batch)
    assert rest == [batch[4], batch[5]]
    rest[0] = Publish("orders", "k", {"seq": 4, "pad": pad})  # the bad value mended
    async with Client.from_config(config) as client:
        await client.publish_batch(rest)
    everything = await read_all(validating.bootstrap, topic, len(batch), QUEUES)
    assert seqs_of(everything) == Counter(range(len(batch)))  # each once: none lost or doubled


async def test_a_partitions_one_batch_refused_fails_that_partition_only(
    validating: Tansu, topic: str, tmp_path: Path
) -> None:
    """A partition's messages in one record batch (the common call, awaited without a
    gather) refused by the broker: on their own, the broker's error and nothing stored;
    next to another partition's, a PartialPublishError naming them."""
    (tmp_path / f"{topic}.json").write_text(SEQ_IS_A_NUMBER)
    config = kafka_config(validating.bootstrap, topic, queues={"total": QUEUES})
    async with Client.from_config(config) as client:
        bad = [Publish("orders", "k", {"seq": "zero"}), Publish("orders", "k", {"seq": 1})]
        with pytest.raises(BrokerError) as refused:
            await client.publish_batch(bad)
        assert not isinstance(refused.value, PartialPublishError | PublishUncertain)
        other = next(f"o{i}" for i in range(64)
                     if client.queue_for("orders", f"o{i}") != client.queue_for("orders", "k"))
        with pytest.raises(PartialPublishError) as caught:
            await client.publish_batch([*bad, Publish("orders", other, {"seq": 2})])
    err = caught.value
    assert sorted(err.failed) == sorted(err.ids[:2]) and list(err.published) == [err.ids[2]]
    assert seqs_of(await read_all(validating.bootstrap, topic, 1, QUEUES)) == {2: 1}
