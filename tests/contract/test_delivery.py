"""Receiving: queue order, tokens, per-stream order, groups, waiting, payloads."""

from __future__ import annotations

import asyncio
import time

import msgspec

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.ids import StreamId
from conveyor.platform.message import (
    CONTENT_BYTES,
    CONTENT_MSGPACK,
    CONTENT_TEXT,
    Message,
    now_ms,
)
from tests.contract.conftest import Open
from tests.contract.support import numbered, numbers, take, take_rest, tokens


async def test_messages_come_in_queue_order_with_their_tokens_set_and_increasing(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    sent = await adapter.enqueue(0, numbered(range(3)))
    sent += await adapter.enqueue(0, numbered(range(3, 7)))
    assert all(t.queue == 0 for t in sent)
    assert sent == sorted(sent) and len(set(sent)) == len(sent)
    receiver = await open_receiver(0, "app")
    got = await take_rest(receiver, 7)
    assert numbers(got) == list(range(7))
    assert tokens(got) == sent


async def test_each_streams_messages_keep_the_order_they_were_enqueued_in(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    # Three streams interleaved on queue 0, a fourth on queue 1, in several batches.
    for batch in range(3):
        await adapter.enqueue(0, [m for i in range(batch * 4, batch * 4 + 4)
                                  for m in numbered([i], key=f"s{i % 3}")])
        await adapter.enqueue(1, numbered(range(batch * 2, batch * 2 + 2), key="other"))
    by_stream: dict[str, list[int]] = {}
    for queue, count in ((0, 12), (1, 6)):
        for m in await take_rest(await open_receiver(queue, "app"), count):
            by_stream.setdefault(m.stream.key, []).append(int(m.body))
    assert by_stream == {
        "s0": [0, 3, 6, 9], "s1": [1, 4, 7, 10], "s2": [2, 5, 8, 11], "other": list(range(6)),
    }


async def test_several_queues_enqueued_at_once_each_get_their_messages_in_order(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    first = await adapter.enqueue_queues(
        {0: numbered(range(5)), 1: numbered(range(100, 103), key="other"), 2: []})
    assert first[2] == []
    second = await adapter.enqueue_queues({1: numbered(range(103, 105), key="other"),
                                          0: numbered(range(5, 7))})
    for queue, count, want in ((0, 7, list(range(7))), (1, 5, list(range(100, 105)))):
        sent = first[queue] + second[queue]
        assert isinstance(sent, list) and all(t.queue == queue for t in sent)
        assert sent == sorted(sent) and len(set(sent)) == count
        got = await take_rest(await open_receiver(queue, "app"), count)
        assert numbers(got) == want
        assert tokens(got) == sent


async def test_every_group_receives_every_message_on_its_own(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    await adapter.enqueue(0, numbered(range(4)))
    first = await open_receiver(0, "first")
    got = await take(first, 4)
    await first.acknowledge(tokens(got))
    second = await open_receiver(0, "second")  # first's acknowledgements are not its own
    assert numbers(await take_rest(second, 4)) == [0, 1, 2, 3]


async def test_get_messages_on_an_idle_queue_returns_nothing_within_its_timeout(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    receiver = await open_receiver(0, "app")
    started = time.monotonic()
    assert await receiver.get_messages(10, timeout_s=0.3) == []
    # "At most timeout_s", with room for a loaded machine; a wait of seconds fails.
    assert time.monotonic() - started < 0.3 + 1.0


async def test_a_message_enqueued_while_get_messages_waits_is_returned_before_the_timeout(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    receiver = await open_receiver(0, "app")
    waiting = asyncio.create_task(receiver.get_messages(10, timeout_s=20))
    await asyncio.sleep(0)  # let it start waiting (a later start finds the message at once)
    started = time.monotonic()
    await adapter.enqueue(0, numbered([7]))
    assert numbers(await asyncio.wait_for(waiting, 10)) == [7]
    assert time.monotonic() - started < 10


async def test_headers_content_types_and_metadata_round_trip(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    at = now_ms()
    sent = [
        Message("m-json", StreamId("orders", "42"), b'{"total": 3}',
                headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                         "x-tenant": "t1"}, enqueued_at_ms=at),
        Message("m-msgpack", StreamId("orders", "42"), msgspec.msgpack.encode({"a": [1, 2]}),
                content_type=CONTENT_MSGPACK, attempt=2, enqueued_at_ms=at),
        Message("m-text", StreamId("notes", ""), "ünïcödé ✓".encode(),
                headers={"x-empty": ""}, content_type=CONTENT_TEXT, enqueued_at_ms=at),
        Message("m-bytes", StreamId("blobs", "b"), bytes(range(256)),
                content_type=CONTENT_BYTES, enqueued_at_ms=at),
    ]
    sent_tokens = await adapter.enqueue(0, sent)
    got = await take_rest(await open_receiver(0, "app"), len(sent))
    assert [m.token for m in got] == sent_tokens
    assert [msgspec.structs.replace(m, token=None) for m in got] == sent


async def test_an_empty_content_type_reads_as_json_on_every_adapter(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    # Redis and Kafka read an empty content-type field as absent (JSON); the memory
    # adapter handed back "", so a handler's ctx.message.content_type differed by broker.
    sent = [Message("m-empty", StreamId("orders", "k"), b"{}", content_type=""),
            Message("m-text", StreamId("orders", "k"), b"t", content_type=CONTENT_TEXT)]
    await adapter.enqueue(0, sent)
    got = await take_rest(await open_receiver(0, "app"), len(sent))
    assert [(m.id, m.body, m.content_type) for m in got] == [
        ("m-empty", b"{}", "application/json"), ("m-text", b"t", CONTENT_TEXT)]


async def test_an_empty_body_and_a_one_megabyte_body_round_trip(
    adapter: QueueAdapter, open_receiver: Open
) -> None:
    large = bytes(range(256)) * (1_000_000 // 256) + b"end"
    sent = [Message("empty", StreamId("ns", "k"), b"", enqueued_at_ms=now_ms()),
            Message("large", StreamId("ns", "k"), large, enqueued_at_ms=now_ms())]
    await adapter.enqueue(0, sent)
    got = await take_rest(await open_receiver(0, "app"), 2)
    assert [m.body for m in got] == [b"", large]
    assert [m.id for m in got] == ["empty", "large"]
