"""Malformed records on Kafka: one bad record never takes good ones with it.

Each case is produced with a plain aiokafka producer (what kcat or any client can do)
between good messages of the same partition; see tests/bad_input.py for the promise
checked. The committed watermark must cover every record: nothing is skipped, nothing
replayed by a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from conveyor.adapters.kafka.codec import letter_record
from conveyor.backends import create_adapter
from conveyor.platform.config import Config
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import DeadLetter, Message, Undecodable
from tests.bad_input import (
    APP,
    GOOD,
    KEY,
    Case,
    Outcome,
    assert_cases_dead_lettered,
    assert_not_utf8_named,
    assert_reasons_name_the_fault,
    case_fields,
    letters_by_case,
    run_cases,
)
from tests.integration.kafka.helpers import kafka_config, nothing_left_unacknowledged
from tests.servers import Tansu

NS = (b"cv-ns", b"good")
CASES = [
    Case("header-value-not-utf8", (NS, (b"x-h", b"\xc3\x28"))),
    Case("key-not-utf8", (NS,), key=b"\xff\xfe"),
    Case("ns-not-utf8", ((b"cv-ns", b"\xc3\x28"),)),
    Case("id-not-utf8", (NS, (b"cv-id", b"\xff"))),
    Case("content-type-not-utf8", (NS, (b"content-type", b"\xff"))),
    Case("attempt-not-a-number", (NS, (b"cv-attempt", b"abc"))),
    Case("ts-garbage", (NS, (b"cv-ts", b"12x"))),
    Case("ts-overflows-any-codec", (NS, (b"cv-ts", b"99999999999999999999999")),
         body=b"not json"),
    Case("cv-key-not-utf8", (NS, (b"cv-key", b"\xff"))),
    Case("body-not-json", (NS, (b"cv-key", KEY)), body=b"not json", expect="DecodeError"),
    Case("ns-empty", ((b"cv-ns", b""),)),  # was handled under default_namespace, or skipped
    Case("value-null", (NS,), body=None),  # was handled as an empty body
    Case("value-null-foreign", (), body=None),  # a tombstone; was default_namespace's b""
    # A header of Conveyor's given twice: the last value won (another namespace's
    # handler took it, or the attempt was the second one)
    Case("ns-given-twice", (NS, (b"cv-ns", b"other"))),
    Case("attempt-given-twice", (NS, (b"cv-attempt", b"1"), (b"cv-attempt", b"2"))),
    Case("body-not-its-content-type", (NS, (b"content-type", b"application/x-protobuf")),
         body=b"\x08\x96\x01", expect="DecodeError"),
    Case("string-not-utf8", (NS,), body=b'{"seq": "\xff"}', expect="DecodeError"),
    Case("msgpack-string-not-utf8", (NS, (b"content-type", b"application/msgpack")),
         body=b"\x81\xa3seq\xa1\xff", expect="DecodeError"),
]


def producer_writer(config: Config) -> Any:
    async def write(queue: int, case: Case, key: str) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=config.kafka.bootstrap)
        await producer.start()
        try:
            headers = [(n.decode(), v) for n, v in case_fields(case, key)]
            await producer.send_and_wait(
                config.kafka.topic, case.body, key=case.key if case.key is not None
                else key.encode(), partition=queue, headers=headers,
            )
        finally:
            await producer.stop()

    return write


async def handled_once_and_lettered(config: Config, cases: Sequence[Case],
                                   write: Any) -> tuple[Outcome, list[DeadLetter]]:
    """``cases`` written between well-formed messages and a worker run over them: every
    well-formed message handled exactly once (no duplicate allowed: nothing fails or
    moves), the committed watermark past every record of both partitions; the run's
    outcome and the dead letters stored."""
    out = await run_cases(config, cases, write)
    assert sorted(out.probe.handled) == sorted(out.published)
    assert len(out.probe.handled) == len(set(out.probe.handled))
    adapter = create_adapter("kafka", config)
    try:
        letters = await adapter.dead_letters.read(APP, limit=1000)
        lag = [await adapter.lag(q, APP) for q in range(2)]
    finally:
        await adapter.close()
    assert lag == [0, 0]
    return out, letters


async def test_every_malformed_record_is_dead_lettered_and_its_neighbours_are_handled(
    tansu: Tansu, topic: str,
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2})
    out, letters = await handled_once_and_lettered(config, CASES, producer_writer(config))
    assert_cases_dead_lettered(letters, CASES, out.key)
    stored = letters_by_case(letters)["key-not-utf8"].message
    assert isinstance(stored, Undecodable) and stored.raw_key == b"\xff\xfe"
    for name in ("value-null", "value-null-foreign"):  # the letter's value is null too
        tombstone = letters_by_case(letters)[name].message
        assert isinstance(tombstone, Undecodable) and tombstone.null_value, name
    assert_reasons_name_the_fault(letters_by_case(letters))
    assert_not_utf8_named(letters_by_case(letters), {
        "ns-not-utf8": "header 'cv-ns'", "key-not-utf8": "the record key",
        "id-not-utf8": "header 'cv-id'", "content-type-not-utf8": "header 'content-type'",
        "header-value-not-utf8": "header 'x-h'", "cv-key-not-utf8": "header 'cv-key'"})



async def test_a_letter_too_large_for_the_broker_is_stored_shorter_and_the_queue_flows(
    tansu: Tansu, topic: str,
) -> None:
    # The message fits the producer's 1 MiB request limit; its dead letter, with the
    # handler's 4 KiB error text beside it, does not. Stored bare (id, reason, where it
    # was), the queue flows on: the good message after it is handled.
    from conveyor import App, WorkerDaemon
    from tests.conftest import wait_until

    config = kafka_config(tansu.bootstrap, topic)
    app = App(APP)
    handled: list[int] = []

    @app.handler("big", retry_attempts=1)
    async def refuse(body: bytes) -> None:
        raise ValueError("refused: " + "x" * 10_000)

    @app.handler("small")
    async def on_small(body: dict[str, int]) -> None:
        handled.append(body["seq"])

    daemon = WorkerDaemon(app, config)
    await daemon.client.publish("big", "k", b"y" * 1_044_000,
                                content_type="application/octet-stream")
    await daemon.client.publish("small", "k", {"seq": 1})
    await daemon.start()
    try:
        await wait_until(lambda: handled == [1] and daemon.stats.dead_lettered == 1, 30,
                         what="the big one dead-lettered and the small one handled")
    finally:
        await daemon.stop()
    adapter = create_adapter("kafka", config)
    try:
        [letter] = await adapter.dead_letters.read(APP)
    finally:
        await adapter.close()
    assert letter.form == "bare" and letter.message.body == b""
    assert "refused: xxx" in letter.error and "MessageSizeTooLargeError" in letter.error
    assert letter.message.stream.namespace == "big" and letter.message.token is not None


class _RawName(str):
    """A header name the pure-Python batch builder writes as ``raw`` (not UTF-8), as
    librdkafka or kcat may write one."""

    raw = b""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        return self.raw


async def send_raw_names(bootstrap: str, topic: str, partition: int, key: bytes | None,
                         value: bytes | None, fields: Sequence[tuple[bytes, bytes | None]],
                         monkeypatch: Any, timestamp_ms: int | None = None) -> None:
    """One record with ``fields`` as headers, names byte for byte (aiokafka's C builder
    would encode a name as UTF-8; its pure-Python one calls the name's ``encode``)."""
    import aiokafka.producer.message_accumulator as accumulator
    import aiokafka.producer.producer as aioproducer
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

    headers = []
    for name, raw in fields:
        text = _RawName("x")
        text.raw = name
        headers.append((text, raw))
    with monkeypatch.context() as patch:
        for module in (accumulator, aioproducer):
            patch.setattr(module, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, key=key, partition=partition,
                                         headers=headers, timestamp_ms=timestamp_ms)
        finally:
            await producer.stop()


def raw_name_writer(config: Config, monkeypatch: Any) -> Any:
    """Writes a case's fields as headers, names byte for byte (:func:`send_raw_names`)."""

    async def write(queue: int, case: Case, key: str) -> None:
        await send_raw_names(config.kafka.bootstrap, config.kafka.topic, queue, key.encode(),
                             case.body, case_fields(case, key), monkeypatch)

    return write


async def test_a_header_name_not_utf8_is_dead_lettered_and_its_partition_flows(
    tansu: Tansu, topic: str, monkeypatch: Any,
) -> None:
    # aiokafka's parser decodes header names as UTF-8: such a record failed every fetch
    # of its partition (an error logged twice a second, everything behind it stuck).
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2})
    cases = [Case("name-not-utf8", (NS, (b"\xff\xfe", b"v"))),
             Case("first-name-not-utf8", ((b"\xc3\x28", b"v"), NS))]
    out, letters = await handled_once_and_lettered(config, cases,
                                                   raw_name_writer(config, monkeypatch))
    found = letters_by_case(letters)
    assert sorted(found) == ["first-name-not-utf8", "name-not-utf8"]
    for case in cases:
        msg = found[case.name].message
        assert isinstance(msg, Undecodable) and msg.body == case.body
        assert "not UTF-8" in msg.reason and found[case.name].error_type == "Undecodable"
        escaped = [(n.decode("utf-8", "backslashreplace").encode(), v)
                   for n, v in case_fields(case, out.key)]
        assert list(msg.raw_fields) == escaped  # the names escaped (\xff), values as written


async def test_a_dead_letter_record_with_a_header_name_not_utf8_is_listed_as_unreadable(
    tansu: Tansu, topic: str, monkeypatch: Any,
) -> None:
    # The dead-letter reader was a plain consumer, whose parser fails on such a record:
    # every listing, count (status) and find of every app failed with UnicodeDecodeError.
    config = kafka_config(tansu.bootstrap, topic)
    letters = [DeadLetter.of(Message(f"m{i}", StreamId(GOOD, "k"), b"{}",
                                     token=SequenceToken(0, i)), "h", ValueError(f"e{i}"), 3)
               for i in range(3)]
    adapter = create_adapter("kafka", config)
    try:
        await adapter.dead_letters.put(APP, letters[:1])  # 0:0
        key, value, headers = letter_record(letters[1], APP)  # 0:1, a name not UTF-8 added
        fields = [(n.encode(), v) for n, v in headers] + [(b"\xff\xfe", b"v")]
        dlq = adapter.cluster.dlq_topic
        await send_raw_names(tansu.bootstrap, dlq, 0, key, value, fields, monkeypatch)
        await send_raw_names(tansu.bootstrap, dlq, 0, b"k", b"x", [(b"\xff", b"v")],
                             monkeypatch)  # 0:2, no letter: no app's
        await adapter.dead_letters.put(APP, letters[2:])  # 0:3
        listed = await adapter.dead_letters.page(APP)
        count = await adapter.dead_letters.count(APP)
        found = [await adapter.dead_letters.find(APP, f"0:{n}") for n in range(4)]
    finally:
        await adapter.close()
    assert [(s.id, s.letter.error) for s in listed] == [
        ("0:0", "e0"), ("0:1", "e1"), ("0:3", "e2")]
    assert count == 3
    unreadable = listed[1].letter.message
    assert isinstance(unreadable, Undecodable)
    assert unreadable.reason == ("DecodeError: header name(s) not UTF-8: b'\\xff\\xfe' "
                                 "(Kafka header names are strings; kept escaped as \\xNN)")
    assert (unreadable.body, unreadable.raw_key) == (b"{}", b"k")
    assert [f.id if f is not None else None for f in found] == ["0:0", "0:1", None, "0:3"]
    assert [isinstance(s.letter.message, Undecodable) for s in listed] == [False, True, False]


async def test_a_handoff_record_with_a_header_name_not_utf8_does_not_stop_its_partition(
    tansu: Tansu, topic: str, monkeypatch: Any, caplog: Any,
) -> None:
    # The hand-off reader was a plain consumer, whose parser fails on such a record (one
    # another client wrote there): the receiver of that queue never started, and every
    # retry failed the same way; the other queue flowed.
    from conveyor import App, WorkerDaemon
    from tests.conftest import wait_until

    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2})
    adapter = create_adapter("kafka", config)
    try:
        handoffs = adapter.handoffs  # type: ignore[attr-defined]
        await handoffs.write("other", 0, 0, "")  # the topic, as a daemon leaves it
        await handoffs.write("other", 1, 0, "")
        for queue in range(2):  # another app's key, and ours with a value of no hand-off
            await send_raw_names(tansu.bootstrap, handoffs.topic, queue, b"other", b"{}",
                                 [(b"\xff\xfe", b"v")], monkeypatch)
            await send_raw_names(tansu.bootstrap, handoffs.topic, queue, APP.encode(),
                                 b"not json", [(b"\xc3\x28", b"v")], monkeypatch)
        await handoffs.write("reader", 0, 5, "cv1:2")  # behind them, still read
        assert await handoffs.read("reader", 0, 5) == {7}
    finally:
        await adapter.close()
    app = App(APP)
    handled: list[str] = []

    @app.handler(GOOD)
    async def on_good(body: dict[str, str]) -> None:
        handled.append(body["k"])

    daemon = WorkerDaemon(app, config)
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        await daemon.client.publish(GOOD, key, {"k": key})
    await daemon.start()
    try:
        await wait_until(lambda: len(handled) >= len(keys), 30, what="every message handled")
        await wait_until(lambda: nothing_left_unacknowledged(daemon), 10,
                         what="lag 0 on both queues")
    finally:
        await daemon.stop()
    assert sorted(handled) == sorted(keys)
    ignored = sorted(r.getMessage() for r in caplog.records if "not a hand-off" in r.message)
    assert ignored == [f"hand-off topic {topic}.conveyor-handoff, queue {q}: the record at "
                       f"offset 2 of app {APP!r} is not a hand-off; ignored" for q in (0, 1)]


async def test_a_member_report_with_a_header_name_not_utf8_does_not_fail_status(
    tansu: Tansu, topic: str, monkeypatch: Any,
) -> None:
    # status read the members topic with a plain consumer, whose parser fails on such a
    # record: status of a kafka-group app failed with UnicodeDecodeError (and so did the
    # console's reading of it, and rewind's check of the queues' owners).
    from conveyor import App, WorkerDaemon
    from conveyor.adapters.kafka.members import members_topic
    from conveyor.backends import for_config
    from conveyor.platform.operations.status import collect_status
    from tests.conftest import wait_until

    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": "kafka-group"})
    app = App(APP)
    handled: list[dict[str, str]] = []

    @app.handler(GOOD)
    async def on_good(body: dict[str, str]) -> None:
        handled.append(body)  # none is published here: the daemon only reports

    daemon = WorkerDaemon(app, config)
    await daemon.start()
    try:
        members = members_topic(daemon.adapter.cluster)  # type: ignore[attr-defined]

        async def listed() -> bool:
            report = await collect_status(config, APP, for_config(config))
            return [m.queues for m in report.members] == [[0, 1]]

        await wait_until(listed, 30, what="the daemon listed with both queues")
        for key in (f"{APP}/ghost".encode(), b"other/x", f"{APP}/\xff".encode("latin-1")):
            await send_raw_names(tansu.bootstrap, members, 0, key, b"not json",
                                 [(b"\xff\xfe", b"v")], monkeypatch)
        report = await collect_status(config, APP, for_config(config))
    finally:
        await daemon.stop()
    assert [(m.id, m.queues) for m in report.members] == [(daemon.member.id, [0, 1])]
    assert handled == []


async def test_a_rewind_to_a_time_scans_past_a_header_name_not_utf8(
    tansu: Tansu, topic: str, monkeypatch: Any,
) -> None:
    # Where the broker gives no offset for a time (rewind.py: no answer, or timestamp
    # -1), a rewind to a time scans the queue's timestamps with the adapter's probe, a
    # plain consumer: a record another client wrote with such a header failed the rewind
    # with UnicodeDecodeError. The tansu here answers, so its answer is taken away.
    import time

    from aiokafka import AIOKafkaConsumer

    async def no_answer(self: AIOKafkaConsumer, timestamps: Any) -> dict[Any, Any]:
        return {}

    monkeypatch.setattr(AIOKafkaConsumer, "offsets_for_times", no_answer)
    config = kafka_config(tansu.bootstrap, topic)
    adapter = create_adapter("kafka", config)
    try:
        await adapter.ensure_topic()  # type: ignore[attr-defined]
        minute_ago = int((time.time() - 60) * 1000)
        for name in (b"\xff\xfe", b"\xff"):  # offsets 0 and 1, a minute old
            await send_raw_names(tansu.bootstrap, topic, 0, b"k", b"{}", [(name, b"v")],
                                 monkeypatch, timestamp_ms=minute_ago)
        after = time.time() - 30
        [token] = await adapter.enqueue(0, [Message("m", StreamId(GOOD, "k"), b"{}")])
        await adapter.rewind_queues([0], APP, after, create_group=True, allow_forward=True)
        lag = await adapter.lag(0, APP)
    finally:
        await adapter.close()
    assert (token.major, lag) == (2, 1)  # positioned at the one record past the time
