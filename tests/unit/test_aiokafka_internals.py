"""What conveyor.adapters.kafka.aiokafka_internals relies on in aiokafka's private parts.

Each test names one reach past aiokafka's public API and checks, on the installed
aiokafka, that it is still there with the call shape the module uses. An aiokafka
upgrade that moves one fails here, by name, instead of in a running daemon.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import inspect
import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka
import aiokafka.conn
import aiokafka.consumer.fetcher as aiokafka_fetcher
import aiokafka.producer.sender
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator, MessageBatch
from aiokafka.record.default_records import (
    DefaultRecordBatchBuilder,
    _DefaultRecordBatchBuilderPy,
    _DefaultRecordBatchPy,
)
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord

import conveyor
from conveyor.adapters.kafka import aiokafka_internals as internals

TS = 1_700_000_000_000
NOWHERE = "127.0.0.1:1"  # clients are built, never started: nothing connects


def _params(fn: object) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]


def test_the_installed_aiokafka_is_the_one_these_pins_were_taken_on() -> None:
    # When this fails, read the failures below before anything else. The package's
    # requirement is this minor version alone: it said >=0.10, and 0.12 failed at
    # import (no RequestStruct), 0.13 in the producer's batch (MessageBatch's arguments).
    assert aiokafka.__version__.startswith("0.14."), aiokafka.__version__
    with (Path(__file__).parents[2] / "pyproject.toml").open("rb") as fh:
        required = tomllib.load(fh)["project"]["dependencies"]
    assert "aiokafka[lz4,snappy,zstd]>=0.14,<0.15" in required


async def test_a_consumer_of_a_group_reaches_its_coordinator_through_coordinator() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=NOWHERE, group_id="g")
    try:
        assert consumer._coordinator is None  # until started, then a GroupCoordinator:
    finally:
        await consumer.stop()
    assert "self._coordinator = GroupCoordinator(" in inspect.getsource(AIOKafkaConsumer.start)


def test_the_coordinator_fetches_committed_offsets_with_their_metadata() -> None:
    fetch = GroupCoordinator.fetch_committed_offsets
    assert inspect.iscoroutinefunction(fetch)
    assert _params(fetch) == ["partitions"]
    read = inspect.getsource(GroupCoordinator._do_fetch_commit_offsets)
    assert "self._do_fetch_commit_offsets(" in inspect.getsource(fetch)
    assert "OffsetAndMetadata(offset, metadata)" in read  # .offset and .metadata


def test_heartbeats_go_through_a_replaceable_do_heartbeat_and_membership_is_readable() -> None:
    heartbeat = GroupCoordinator._do_heartbeat
    assert inspect.iscoroutinefunction(heartbeat)
    assert _params(heartbeat) == []
    assert "self._do_heartbeat()" in inspect.getsource(GroupCoordinator)  # looked up per call
    init = inspect.getsource(GroupCoordinator.__init__)
    assert "self.member_id = " in init and "self.generation = " in init


def test_heartbeats_cannot_be_observed_on_a_consumer_without_a_coordinator() -> None:
    class Bare:
        _coordinator = None

    assert internals.observe_heartbeats(Bare(), lambda sent: None) is False
    assert internals.membership(Bare()) == ("", -1)


async def test_a_producer_is_idempotent_exactly_when_it_has_a_transaction_manager() -> None:
    plain = AIOKafkaProducer(bootstrap_servers=NOWHERE)
    idempotent = AIOKafkaProducer(bootstrap_servers=NOWHERE, enable_idempotence=True)
    try:
        assert internals.is_idempotent(plain) is False
        assert internals.is_idempotent(idempotent) is True
    finally:
        await plain.stop()
        await idempotent.stop()


async def test_a_producer_fails_what_it_holds_through_its_accumulator_and_has_a_client(
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=NOWHERE)
    try:
        accumulator = producer._message_accumulator
        assert inspect.signature(accumulator.fail_all).parameters.keys() == {"exception"}
        assert "fail_all" in inspect.getsource(aiokafka.producer.sender)  # as its sender does
        assert inspect.iscoroutinefunction(producer.client.close)
        assert isinstance(accumulator._batches, dict)  # partition -> its queued batches
        assert isinstance(accumulator._pending_batches, set)  # the ones sent
    finally:
        await producer.stop()


async def test_a_failed_batch_holds_the_error_in_its_future_and_drain_waiter() -> None:
    """What drop_pending marks retrieved: a batch's ``future`` (which ``send_batch``
    shields, and ``failure`` leaves unretrieved for a batch without per-message futures)
    and ``_drain_waiter`` (a later send to the partition awaits it)."""
    batch = MessageBatch(TopicPartition("t", 0), BatchBuilder(16_384, 0), 30, 0)
    batch.failure(ValueError("dropped"))
    for future in (batch.future, batch._drain_waiter):
        assert future.done() and isinstance(future.exception(), ValueError)
    assert "asyncio.shield(batch.future)" in inspect.getsource(MessageAccumulator.add_batch)
    assert "self._drain_waiter" in inspect.getsource(MessageBatch.wait_drain)


async def test_the_batch_send_batch_queued_is_its_partitions_last_with_the_shielded_future(
) -> None:
    """What queued_batch reaches for: ``add_batch`` appends the batch to ``_batches[tp]``
    (keeping the builder as ``_builder``) and returns a shield of its ``future`` with no
    pause after; ``send_batch`` returns that shield as it comes."""
    producer = AIOKafkaProducer(bootstrap_servers=NOWHERE)
    try:
        tp, builder = TopicPartition("t", 0), producer.create_batch()
        shield = await producer._message_accumulator.add_batch(builder, tp, 1.0)
        inside = internals.queued_batch(producer, tp, builder).future
        assert inside is not shield
        inside.set_exception(ValueError("failed"))
        await asyncio.sleep(0)  # the shield's callback
        assert isinstance(shield.exception(), ValueError)
        assert internals.queued_batch(producer, tp, producer.create_batch()) is None
        assert internals.queued_batch(producer, TopicPartition("t", 1), builder) is None
    finally:
        await producer.stop()
    source = inspect.getsource(MessageAccumulator.add_batch)
    assert ("batch = self._append_batch(builder, tp)\n"
            "                return asyncio.shield(batch.future)") in source
    send_batch = inspect.getsource(AIOKafkaProducer.send_batch)
    assert send_batch.rstrip().endswith("batch, tp, self._request_timeout_ms / 1000\n"
                                        "        )\n        return future")


async def test_a_batch_the_sender_never_took_is_withdrawn_and_one_it_took_is_not() -> None:
    """What withdraw reaches for: the sender takes a batch (``_pop_batch``, which counts
    it in ``retry_count``) and queues it again at the front after a failed request
    (``reenqueue``); a batch behind it was never taken. Only that one is withdrawn: it
    leaves the queue, its future fails, and a send waiting behind it is woken."""
    producer = AIOKafkaProducer(bootstrap_servers=NOWHERE)
    try:
        accumulator = producer._message_accumulator
        tp = TopicPartition("t", 0)
        first, second = producer.create_batch(), producer.create_batch()
        await accumulator.add_batch(first, tp, 1.0)
        taken = internals.queued_batch(producer, tp, first)
        assert accumulator._pop_batch(tp) is taken and taken.retry_count == 1
        accumulator._append_batch(second, tp)  # add_batch's step, without its wait
        accumulator.reenqueue(taken)
        behind = internals.queued_batch(producer, tp, second)
        assert list(accumulator._batches[tp]) == [taken, behind]
        gone = ValueError("withdrawn")
        assert not internals.withdraw(producer, taken, gone)
        assert internals.withdraw(producer, behind, gone)
        assert list(accumulator._batches[tp]) == [taken]
        assert behind.future.exception() is gone and behind._drain_waiter.done()
        assert behind.tp == tp
        assert not internals.withdraw(producer, behind, gone)  # not there any more
    finally:
        await producer.stop()


def test_the_admin_client_sends_a_request_to_a_node() -> None:
    send = AIOKafkaAdminClient._send_request
    assert inspect.iscoroutinefunction(send)
    assert _params(send) == ["request", "node_id"]


def test_delete_groups_is_built_and_its_answer_read_as_the_protocol_defines() -> None:
    request = internals.delete_groups_request(["app"]).prepare({42: (0, 2)})
    assert (request.API_KEY, request.API_VERSION) == (42, 0)
    assert request.encode() == b"\x00\x00\x00\x01\x00\x03app"
    answer = request.RESPONSE_TYPE(0, [("app", 69)]).encode()
    assert request.RESPONSE_TYPE.decode(answer).results == [("app", 69)]


def test_a_broker_without_delete_groups_refuses_it_as_group_deletion_expects() -> None:
    with pytest.raises(IncompatibleBrokerVersion):
        internals.delete_groups_request(["app"]).prepare({})


def test_leave_group_is_built_from_group_and_member() -> None:
    request = internals.leave_group_request("app", "member-1").prepare({13: (0, 0)})
    assert request.API_KEY == 13
    assert (request.group, request.member_id) == ("app", "member-1")
    answer = request.RESPONSE_TYPE(25).encode()
    assert request.RESPONSE_TYPE.decode(answer).error_code == 25


def test_a_records_size_is_estimated_as_the_producer_checks_it() -> None:
    small = internals.record_size(b"k", b"v", [])
    large = internals.record_size(b"k", b"v" * 1000, [("h", b"x")])
    assert isinstance(small, int) and 0 < small < large
    assert large >= 1000 + len("h") + 1


def test_records_go_into_a_batchs_record_builder_and_a_sealed_batch_does_not_linger() -> None:
    batch = BatchBuilder(16_384, 0)
    append = internals.record_appender(batch)
    for offset in range(3):
        meta = append(offset, 1_700_000_000_000, b"k", b"v%d" % offset, [("h", b"x")])
        assert meta is not None and meta.size > 0
    internals.seal(batch, 3)
    assert batch.closed() and batch.record_count() == 3  # as three BatchBuilder.append
    assert batch.append(timestamp=None, key=b"k", value=b"late") is None
    records = MemoryRecords(bytes(batch._build())).next_batch()
    assert [bytes(r.value) for r in records] == [b"v0", b"v1", b"v2"]
    # The sender sends a closed batch at once, not after linger_ms; the idempotent
    # producer numbers a batch's sequence by its record count.
    assert "self._builder.closed()" in inspect.getsource(MessageBatch.remaining_linger)
    assert "record_count" in inspect.getsource(MessageAccumulator._pop_batch)
    assert "self._relative_offset" in inspect.getsource(BatchBuilder.record_count)


def test_member_metadata_and_assignment_decode_to_topics_and_partitions() -> None:
    meta = ConsumerProtocolMemberMetadata(0, ["orders", "other"], b"").encode()
    assert internals.subscription(meta) == ["orders", "other"]
    raw = ConsumerProtocolMemberAssignment(0, [("orders", [1, 2])], b"").encode()
    assert sorted(internals.assignment(raw)) == [TopicPartition("orders", 1),
                                                 TopicPartition("orders", 2)]


def test_the_sticky_assignor_keeps_its_state_in_class_attributes_a_subclass_isolates() -> None:
    assert StickyPartitionAssignor.member_assignment is None
    one, two = internals.sticky_assignor(), internals.sticky_assignor()
    assert issubclass(one, StickyPartitionAssignor)
    assert one.generation == StickyPartitionAssignor.DEFAULT_GENERATION_ID
    one.on_assignment(ConsumerProtocolMemberAssignment(0, [("orders", [3])], b""))
    assert one.member_assignment == [TopicPartition("orders", 3)]
    assert two.member_assignment is None and StickyPartitionAssignor.member_assignment is None


def test_a_refused_scram_login_raises_in_the_functions_the_login_check_names() -> None:
    source = inspect.getsource(aiokafka.conn)
    for name in internals.SCRAM_STEPS:
        assert f"def {name}(" in source, name


def test_the_senders_init_producer_id_error_is_the_line_the_filter_drops() -> None:
    assert logging.getLogger(internals.SENDER_LOGGER) is aiokafka.producer.sender.log
    source = inspect.getsource(aiokafka.producer.sender)
    assert f'log.error("{internals.INIT_PRODUCER_ID_ERROR}: %s", error_type)' in source


def _batch(count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**20)
    for i in range(count):
        builder.append(i, timestamp=TS + i, key=f"k{i % 3}".encode(), value=b"{}",
                       headers=[("cv-ns", b"orders"), ("cv-id", f"m{i}".encode())])
    return bytes(builder.build())


def test_the_fetcher_builds_partition_records_from_the_module_global_with_its_key_deserializer(
) -> None:
    build = inspect.getsource(aiokafka_fetcher.Fetcher._proc_fetch_request)
    assert "partition_records = PartitionRecords(" in build  # the global, looked up per fetch
    assert _params(aiokafka_fetcher.PartitionRecords.__init__)[:5] == [
        "tp", "records", "aborted_transactions", "fetch_offset", "key_deserializer"]
    assert "self._key_deserializer," in build.split("PartitionRecords(")[1].split(")")[0]
    unpack = inspect.getsource(aiokafka_fetcher.PartitionRecords._unpack_records)
    assert "self._consumer_record(tp, record)" in unpack  # looked up on the instance


def test_a_consumer_marked_for_raw_records_gets_them_as_the_batch_parsed_them() -> None:
    raw = internals.raw_records()["key_deserializer"]
    tp = TopicPartition("t", 2)

    def fetched(key_deserializer: Any) -> list[Any]:
        return list(aiokafka_fetcher.PartitionRecords(
            tp, MemoryRecords(_batch(5)), [], 1, key_deserializer, None, True, 0))

    records, plain = fetched(raw), fetched(None)
    assert [type(r) for r in plain] == [ConsumerRecord] * 4  # other consumers: unchanged
    assert not any(isinstance(r, ConsumerRecord) for r in records)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in plain]
    assert aiokafka_fetcher.PartitionRecords is type(
        aiokafka_fetcher.PartitionRecords(tp, MemoryRecords(b""), [], 0, None, None, True, 0))
    assert internals.raw_records()["key_deserializer"] is not raw  # one per consumer
    assert raw(b"k") == b"k"  # were it called as a deserializer: keys pass unchanged


async def test_a_partition_given_a_converter_yields_its_records_converted_as_unpacked() -> None:
    # What a receiver's decoder rides on: each record converted as the fetch is unpacked,
    # so the parsed records (tracked by the garbage collector) are freed one by one
    # instead of all being alive at once in the list getall returns.
    consumer = AIOKafkaConsumer(bootstrap_servers=NOWHERE, **internals.raw_records())
    converters = internals.record_converters(consumer)
    assert converters == {}
    tp, other = TopicPartition("t", 1), TopicPartition("t", 2)
    alive: list[int] = []

    def convert(record: Any) -> tuple[int, bytes]:
        # Counted at four records, not all 200: a walk of the whole heap takes tens of
        # ms in a long test run, and had all been alive at once, 50 would be by now.
        if record.offset % 50 == 49:
            alive.append(sum(1 for o in gc.get_objects() if type(o) is type(record)))
        return record.offset, record.key

    converters[tp] = SimpleNamespace(one=convert)

    def fetched(partition: TopicPartition) -> list[Any]:
        return list(aiokafka_fetcher.PartitionRecords(
            partition, MemoryRecords(_batch(200)), [], 0, consumer._key_deserializer,
            None, True, 0))

    assert fetched(tp) == [(i, f"k{i % 3}".encode()) for i in range(200)]
    # Alive: the one being converted (and the batch's iterator state).
    assert len(alive) == 4 and max(alive) <= 2
    assert [r.offset for r in fetched(other)] == list(range(200))  # no converter: raw
    assert internals.record_converters(AIOKafkaConsumer(bootstrap_servers=NOWHERE)) == {}


def test_raw_records_unpack_as_aiokafka_unpacks_them() -> None:
    # _raw_unpack mirrors _unpack_records for uncommitted reads: the CRC check, control
    # batches skipped, records below the fetch offset skipped, next_fetch_offset kept.
    unpack = inspect.getsource(aiokafka_fetcher.PartitionRecords._unpack_records)
    for step in ("self._check_crcs and not next_batch.validate_crc()",
                 "self._isolation_level == READ_COMMITTED",
                 "if next_batch.is_control_batch:",
                 "if record.offset < self.next_fetch_offset:",
                 "self.next_fetch_offset = record.offset + 1",
                 "self.next_fetch_offset = next_batch.next_offset"):
        assert step in unpack, step
    # getall steps what iter() of the records gives (our generator, for raw records)
    assert "for msg in self._partition_records:" in inspect.getsource(
        aiokafka_fetcher.FetchResult.getall)
    raw = internals.raw_records()["key_deserializer"]
    tp = TopicPartition("t", 0)
    batches = _batch(5) + _batch(5)  # offsets 0-4 twice: the second batch is all skipped

    def read(key_deserializer: Any, max_records: int) -> tuple[list[int], list[int]]:
        records = aiokafka_fetcher.PartitionRecords(
            tp, MemoryRecords(batches), [], 2, key_deserializer, None, True, 0)
        offsets, positions = [], []
        while True:  # as FetchResult.getall takes them, max_records at a time
            taken = []
            for record in records:
                taken.append(record.offset)
                if len(taken) >= max_records:
                    break
            offsets += taken
            positions.append(records.next_fetch_offset)
            if len(taken) < max_records:  # exhausted (getall drops the records then)
                return offsets, positions

    for size in (1, 2, 500):
        assert read(raw, size) == read(None, size)
    assert read(raw, 2)[0] == [2, 3, 4]


class _RawName(str):
    """A header name that a builder writes as ``raw``, bytes UTF-8 refuses (as librdkafka
    or kcat may write them)."""

    raw = b""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        return self.raw


def _batch_with_a_raw_header_name(base: int, compression_type: int = 0) -> bytes:
    """Records ``base`` to ``base + 2``; the middle one has header name ``b"\\xff\\xfe"``."""
    name = _RawName("x")
    name.raw = b"\xff\xfe"
    builder = _DefaultRecordBatchBuilderPy(magic=2, compression_type=compression_type,
                                           is_transactional=0, producer_id=-1,
                                           producer_epoch=-1, base_sequence=-1,
                                           batch_size=2**20)
    for i, headers in enumerate([[("cv-ns", b"a")], [("cv-ns", b"b"), (name, b"v")],
                                 [("cv-ns", b"c")]]):
        builder.append(i, timestamp=TS + i, key=b"k", value=b"%d" % (base + i),
                       headers=headers)
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big")  # BaseOffset, outside the CRC
    return bytes(data)


class _Converter:
    def one(self, record: Any) -> tuple[str, int, bytes | None]:
        return "one", record.offset, record.value

    def unreadable(self, record: internals.UnreadableRecord) -> tuple[str, int, Any]:
        return "unreadable", record.offset, (record.headers, record.reason)


@pytest.mark.parametrize("compression_type", [0, 1], ids=["plain", "gzip"])
async def test_a_header_name_the_parser_refuses_is_one_unreadable_record_not_a_stuck_partition(
    compression_type: int,
) -> None:
    # aiokafka's parser decodes header names as UTF-8 and raises at such a record on
    # every fetch; the batch is read again from the fetch's bytes: its records before and
    # after come as usual, that one as the converter's ``unreadable`` makes it.
    consumer = AIOKafkaConsumer(bootstrap_servers=NOWHERE, **internals.raw_records())
    assert aiokafka_fetcher.MemoryRecords is internals._Fetched  # keeps a fetch's bytes
    await consumer.stop()  # never started: only its key deserializer is used
    tp = TopicPartition("t", 0)
    internals.record_converters(consumer)[tp] = _Converter()
    data = _batch(2) + _batch_with_a_raw_header_name(2, compression_type)
    fetched = aiokafka_fetcher.MemoryRecords(data)
    records = aiokafka_fetcher.PartitionRecords(
        tp, fetched, [], 1, consumer._key_deserializer, None, True, 0)
    out = list(records)
    assert [(kind, offset) for kind, offset, _ in out] == [
        ("one", 1), ("one", 2), ("unreadable", 3), ("one", 4)]
    headers, reason = out[2][2]
    assert headers == [("cv-ns", b"b"), ("\\xff\\xfe", b"v")]
    assert "not UTF-8" in reason and "\\xff\\xfe" in reason
    assert out[3][2] == b"4" and records.next_fetch_offset == 5
    # without a converter (records fetched before the decoder is given): as read
    raw = list(aiokafka_fetcher.PartitionRecords(
        tp, aiokafka_fetcher.MemoryRecords(data), [], 0, internals.raw_records()[
            "key_deserializer"], None, True, 0))
    assert [type(r) is internals.UnreadableRecord for r in raw] == [False] * 3 + [True, False]


def test_the_fetcher_builds_memory_records_from_the_module_global_and_asks_two_things() -> None:
    build = inspect.getsource(aiokafka_fetcher.Fetcher._proc_fetch_request)
    assert "records = MemoryRecords(part_data[-1])" in build
    used = {m for m in ("has_next", "size_in_bytes", "next_batch") if f"records.{m}(" in build}
    assert used == {"has_next", "size_in_bytes"}  # what _Fetched answers before unwrapping
    batch = _DefaultRecordBatchPy(_batch_with_a_raw_header_name(0))
    assert {"_maybe_uncompress", "_buffer", "_pos", "_num_records"} <= set(dir(batch))
    assert "decode(\"utf-8\")" in inspect.getsource(_DefaultRecordBatchPy._read_msg)


PRIVATE_NAMES = {"_coordinator", "_send_request", "_txn_manager", "_do_heartbeat",
                 "_message_accumulator",
                 "PartitionRecords", "_consumer_record", "_builder", "_relative_offset",
                 "_key_deserializer"}
PRIVATE_MODULES = ("aiokafka.protocol", "aiokafka.record", "aiokafka.coordinator.protocol",
                   "aiokafka.coordinator.assignors.sticky", "aiokafka.conn",
                   "aiokafka.consumer.fetcher", "aiokafka.producer")


def test_no_other_module_of_conveyor_reaches_into_aiokafka() -> None:
    package = Path(conveyor.__file__).parent
    home = Path(internals.__file__)
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
                found.append(f"{path.relative_to(package)}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in PRIVATE_NAMES:
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    PRIVATE_MODULES):
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.module}")
    assert found == [], "move these into conveyor/adapters/kafka/aiokafka_internals.py"
