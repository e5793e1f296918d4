"""Client.publish_batch's own work on the memory adapter: ids, the stream cache, refusals."""

import asyncio
import enum
import math
import re
import threading
import warnings

import msgspec
import pytest

from conveyor import client as client_module
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.client import Client, Publish, SyncClient
from conveyor.platform.config import Config
from conveyor.platform.errors import (
    BodyEncodeError,
    ConveyorError,
    InvalidArgumentError,
    MessageTooLargeError,
    ShutdownError,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import MAX_HEADER_BYTES, new_message_ids


@pytest.fixture
def client() -> Client:
    reset_broker("client-publish")
    return Client(MemoryAdapter("client-publish"), HashRingQueueMapper(4))


def stored(client: Client) -> dict[str, tuple[int, str, str]]:
    """Every stored message by id: (queue, namespace, key)."""
    adapter = client.adapter
    assert isinstance(adapter, MemoryAdapter)
    return {m.id: (q, m.stream.namespace, m.stream.key)
            for q, log in adapter.broker.logs.items() for m in log.items}


def test_a_batchs_ids_are_32_hex_digits_and_unique_across_batches() -> None:
    batches = [new_message_ids(n) for n in (0, 1, 500, 3000, 3000)]
    assert [len(b) for b in batches] == [0, 1, 500, 3000, 3000]
    ids = [i for batch in batches for i in batch]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    # within a batch: one random part, then the place in the batch (past the table too)
    assert {i[:24] for i in batches[3]} == {batches[3][0][:24]}
    assert [int(i[24:], 16) for i in batches[3]] == list(range(3000))
    assert batches[3][0][:24] != batches[4][0][:24]


async def test_streams_land_on_their_queues_when_the_cache_starts_over_mid_batch(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "_STREAMS_REMEMBERED", 3)
    items = [Publish(ns, f"k{i % 5}", {"i": i}) for i in range(20) for ns in ("a", "b")]
    tokens = await client.publish_batch(items)
    assert len(tokens) == len(items) and len(set(tokens)) == len(items)
    found = stored(client)
    mapper = client.mapper
    assert len(found) == len(items)
    assert all(q == mapper.queue_for_key(ns, key) for q, ns, key in found.values())
    assert client._remembered <= 3
    assert sum(len(s) for s in client._streams.values()) == client._remembered
    # each token names its own message's place, in input order per queue
    adapter = client.adapter
    assert isinstance(adapter, MemoryAdapter)
    by_token = {m.token: m for log in adapter.broker.logs.values() for m in log.items}
    assert [by_token[t].body for t in tokens] == [f'{{"i":{it.body["i"]}}}'.encode()
                                                    for it in items]


async def test_a_bad_item_refuses_the_whole_batch(client: Client) -> None:
    client.max_body_bytes = 100
    good = [Publish("a", "k", {"i": i}) for i in range(3)]
    with pytest.raises(MessageTooLargeError):
        await client.publish_batch([*good, Publish("a", "k", "x" * 101)])
    with pytest.raises(ConveyorError, match="reserved"):
        await client.publish_batch([*good, Publish("a", "k", {}, {"cv-id": "mine"})])
    with pytest.raises(ConveyorError, match="namespace"):
        await client.publish_batch([*good, Publish("", "k", {})])
    with pytest.raises(InvalidArgumentError,  # was AttributeError: 'tuple' object has ...
                       match=r"item 3 is tuple \('a', 'k', \{\}\), not a conveyor.Publish"):
        await client.publish_batch([*good, ("a", "k", {})])  # type: ignore[list-item]
    assert stored(client) == {}


@pytest.mark.parametrize(
    ("headers", "content_type", "key"),
    [
        ({"tenant": b"\xff"}, None, "k"),  # bytes: Redis stored it, its worker could not read it
        ({"tenant": 1}, None, "k"),  # Redis stored "1", the memory adapter 1
        ({"tenant": None}, None, "k"),  # redis-py: "A tuple item must be str, int, ..."
        ({b"tenant": "acme"}, None, "k"),
        ({"tenant": "caf\udce9"}, None, "k"),  # a lone surrogate: UnicodeEncodeError at send
        ({}, "text/\udce9", "k"),
        ({}, None, "caf\udce9"),
        ({}, None, 1),  # was sent as the stream "1"
        ({}, None, None),  # was sent as the stream "None"
        ({}, None, b"k"),  # was sent as the stream "b'k'"
    ],
)
async def test_headers_content_types_and_keys_that_are_not_utf8_text_are_refused(
    client: Client, headers: dict[object, object], content_type: str | None, key: str
) -> None:
    # Refused while the message is built, as one line, before anything is sent: the
    # brokers' wire formats carry text, and the memory adapter must not accept more.
    good = [Publish("a", "k", {"i": i}) for i in range(3)]
    bad = Publish("a", key, {}, headers, content_type)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="nothing was sent") as raised:
        await client.publish_batch([*good, bad])
    assert "\n" not in str(raised.value)
    with pytest.raises(InvalidArgumentError, match="nothing was sent"):
        await client.publish("a", key, {}, headers, content_type)  # type: ignore[arg-type]
    assert stored(client) == {}


async def test_a_one_queue_batch_returns_its_tokens_in_order(client: Client) -> None:
    items = [Publish("a", "k", {"i": i}) for i in range(5)]
    first = await client.publish_batch(items[:2])
    tokens = await client.publish_batch(items[2:])
    queue = client.queue_for("a", "k")
    assert [*first, *tokens] == [SequenceToken(queue, i) for i in range(5)]


class Line(msgspec.Struct):
    sku: str
    price: float


def nested(depth: int) -> list[object]:
    top: list[object] = []
    inner = top
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return top


@pytest.mark.parametrize(("body", "where"), [
    ({"total": float("nan")}, "nan at $.total"),
    ({"lines": [{"price": 1.5}, {"price": float("inf")}]}, "inf at $.lines[1].price"),
    ({"coupon": None, "lines": [Line("a", 2.0), Line("b", float("-inf"))]},
     "-inf at $.lines[1].price"),
    (float("nan"), "nan at $"),
])
async def test_a_float_json_cannot_carry_is_refused_not_sent_as_null(
        client: Client, body: object, where: str) -> None:
    # msgspec writes NaN and infinity as null: a dict handler got None for a number.
    good = [Publish("typed", f"t{i}", {"i": i, "note": None}) for i in range(20)]
    with pytest.raises(BodyEncodeError, match="nothing was sent") as raised:
        await client.publish_batch([*good, Publish("typed", "t1", body)])
    with pytest.raises(InvalidArgumentError, match="nothing was sent") as single:
        await client.publish("typed", "t1", body)
    for error in (raised.value, single.value):
        assert "\n" not in str(error)
        assert "stream typed/t1" in str(error) and where in str(error), str(error)
    assert stored(client) == {}


async def test_nulls_of_nones_and_of_text_go_as_they_are_and_msgpack_keeps_nan(
        client: Client) -> None:
    bodies = [{"coupon": None}, {"note": "null"}, [None, 1.5], [None]]
    await client.publish_batch([Publish("a", "k", body) for body in bodies])
    for body in bodies:
        await client.publish("a", "k", body)
    await client.publish("a", "k", {"x": float("nan")}, content_type="application/msgpack")
    adapter = client.adapter
    assert isinstance(adapter, MemoryAdapter)
    [log] = [log for log in adapter.broker.logs.values() if log.items]
    json = [msgspec.json.encode(body) for body in bodies]
    assert [m.body for m in log.items[:8]] == [*json, *json]
    assert math.isnan(msgspec.msgpack.decode(log.items[8].body)["x"])  # kept


DEEP = nested(100_000)


@pytest.mark.parametrize(("body", "content_type", "why"), [
    (object(), None, "as JSON: Encoding objects of type object is unsupported"),
    ({(1, 2): 3}, None, "as JSON: Only dicts with str-like or number-like keys"),
    (DEEP, None, "as JSON: it is nested too deeply"),
    ("caf\udce9", None, "as UTF-8 text: it holds a lone surrogate ('\\udce9')"),
    ({"name": "caf\udce9"}, None, "as JSON: it holds a lone surrogate"),
    ({"n": 2**70}, "application/msgpack", "as msgpack: can't serialize ints"),
    (object(), "application/msgpack", "as msgpack: Encoding objects of type object"),
], ids=["object", "tuple-key", "deep", "surrogate-str", "surrogate-in-dict", "big-int",
        "msgpack-object"])
async def test_a_body_that_cannot_be_encoded_is_one_error_naming_the_stream(
        client: Client, body: object, content_type: str | None, why: str) -> None:
    good = [Publish("a", "k", {"i": i}) for i in range(3)]
    with pytest.raises(BodyEncodeError) as raised:
        await client.publish_batch([*good, Publish("a", "k", body, content_type=content_type)])
    with pytest.raises(BodyEncodeError) as single:
        await client.publish("a", "k", body, content_type=content_type)
    for error in (raised.value, single.value):
        # Callers that caught what encoding raised before keep catching it.
        assert isinstance(error, TypeError) and isinstance(error, ValueError)
        assert str(error).startswith("message to stream a/k: its body cannot be encoded ")
        assert why in str(error) and str(error).endswith("; nothing was sent"), str(error)
        assert "\n" not in str(error)
    assert stored(client) == {}


async def test_a_null_beside_bytes_that_look_like_a_packed_nan_goes_as_it_is(
        client: Client) -> None:
    # The msgpack hint matched (0xcb 0x7f 0xf8 in the bytes) and the walk could not
    # convert a msgspec.Raw: that raised a bare TypeError for a body with no NaN at all.
    body = {"doc": msgspec.Raw(b'{"parent":null}'), "sig": bytes.fromhex("00cb7ff812")}
    await client.publish("a", "k", body)
    await client.publish_batch([Publish("a", "k", body)])
    assert len(stored(client)) == 2


async def test_str_enum_members_are_text_for_streams_headers_and_content_types(
        client: Client) -> None:
    import enum

    class Names(enum.StrEnum):
        ORDERS = "orders"
        TENANT = "tenant"
        JSON = "application/json"

    await client.publish(Names.ORDERS, "k", {"i": 1}, {Names.TENANT: Names.ORDERS},
                         Names.JSON)
    assert [ns for _, ns, _ in stored(client).values()] == ["orders"]


async def test_a_closed_client_refuses_to_publish_single_and_batch(client: Client) -> None:
    # publish_batch went straight to the adapter: after close() it was stored (a Redis
    # client even opened a new connection that nobody closed); on the memory adapter
    # publish was stored too. Closing twice does no harm.
    await client.close()
    with pytest.raises(ShutdownError, match="closed"):
        await client.publish("a", "k", {})
    with pytest.raises(ShutdownError, match="closed"):
        await client.publish_batch([Publish("a", "k", {})])
    await client.close()
    assert stored(client) == {}


def test_a_sync_client_shared_by_threads_stores_what_it_says_it_stored() -> None:
    # Two threads' Runner.run on one loop: the second scheduled its publish on the loop
    # the first was running, then raised "This event loop is already running" while its
    # message was stored; a caller retrying on the error doubled it.
    reset_broker("sync-threads")
    config = msgspec.convert({"memory": {"broker": "sync-threads"}}, Config)
    sync = SyncClient.from_config(config)
    returned: list[SequenceToken] = []
    errors: list[BaseException] = []

    def publish(thread: int) -> None:
        for i in range(100):
            try:
                returned.append(sync.publish("a", f"t{thread}", {"i": i}))
            except BaseException as exc:  # counted and asserted on
                errors.append(exc)

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored_count = len(stored(sync._client))
    assert (len(errors), len(returned), stored_count) == (0, 400, 400), errors[:1]
    sync.close()
    sync.close()  # was "Runner is closed" (a RuntimeError), as was a publish
    with pytest.raises(ShutdownError, match="closed"):
        sync.publish("a", "k", {})


async def test_a_sync_client_made_inside_a_running_loop_says_to_await_a_client() -> None:
    # Was RuntimeError from asyncio's Runner and a "coroutine was never awaited" warning.
    with pytest.raises(InvalidArgumentError, match="an event loop is running here"):
        SyncClient(Config())


def test_a_sync_client_called_inside_a_running_loop_refuses_and_stays_usable() -> None:
    # A SyncClient made at import, then called from an `async def`: each call raised
    # Runner's "cannot be called from a running event loop" (and a "coroutine was never
    # awaited" warning); close() marked it closed before failing so, and its connections
    # were never closed (a later close did nothing). Each says what to do instead, as
    # the constructor does, and changes nothing.
    reset_broker("sync-in-loop")
    sync = SyncClient(msgspec.convert({"memory": {"broker": "sync-in-loop"}}, Config))

    async def inside() -> None:
        for call in (lambda: sync.publish("a", "k", {}),
                     lambda: sync.publish_batch([Publish("a", "k", {})]), sync.close):
            with pytest.raises(InvalidArgumentError, match="an event loop is running here"):
                call()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no coroutine left unawaited
        asyncio.run(inside())
    assert stored(sync._client) == {}
    sync.publish("a", "k", {"n": 1})
    assert len(stored(sync._client)) == 1
    sync.close()
    assert sync._runner._loop is None  # closed now: its loop, and so its connections


LONG = "K" * 1_000_000


@pytest.mark.parametrize(("namespace", "key", "body"), [
    ("a", LONG, {"x": math.nan}),  # BodyEncodeError
    (LONG, "k", object()),  # BodyEncodeError
    ("a", LONG, "x" * 101),  # MessageTooLargeError
    ("a", LONG + "\udcff", {}),  # InvalidArgumentError: not UTF-8 text
])
async def test_a_refusal_of_a_message_with_a_huge_name_is_one_short_line(
    client: Client, namespace: str, key: str, body: object,
) -> None:
    # A 1 MB stream key (Redis and the memory adapter take it) made each refusal's one
    # line a megabyte long: the stream was named in full.
    client.max_body_bytes = 100
    with pytest.raises(InvalidArgumentError) as single:
        await client.publish(namespace, key, body)
    with pytest.raises(InvalidArgumentError) as batch:
        await client.publish_batch([Publish(namespace, key, body)])
    for error in (single.value, batch.value):
        assert len(str(error)) < 400 and "\n" not in str(error), str(error)[:400]
        assert "nothing was sent" in str(error), str(error)[:400]
        assert "characters)" in str(error), str(error)[:400]  # says it was cut
    assert stored(client) == {}


@pytest.mark.parametrize("key", ["a\nERROR forged", "a\r\x1b[31mred", "a\u2028b", "a\x85b"])
@pytest.mark.parametrize("body", [object(), {"x": math.nan}, "x" * 101, None])
async def test_a_refusal_naming_a_key_that_breaks_lines_is_one_line(
    client: Client, key: str, body: object,
) -> None:
    # A stream key is any text, a newline too (the client takes it): a refusal named it
    # as it was, so the one-line error spread over two lines, the second posing as
    # whatever the key said. It is shown escaped.
    client.max_body_bytes = 100
    with pytest.raises(InvalidArgumentError) as single:
        await client.publish("a", key, body)
    with pytest.raises(InvalidArgumentError) as batch:
        await client.publish_batch([Publish("a", key, body)])
    for error in (single.value, batch.value):
        text = str(error)
        assert len(text.splitlines()) == 1 and text.isprintable(), text
        assert f"stream a/{repr(key)[1:-1]}: " in text, text
    assert stored(client) == {}


@pytest.mark.parametrize("headers", ["tenant=acme", 5, ["tenant"], [("a", "b", "c")]])
async def test_headers_that_are_no_mapping_are_refused_in_one_line(
    client: Client, headers: object,
) -> None:
    # dict(headers) raised as itself: "dictionary update sequence element #0 has length
    # 1; 2 is required", "'int' object is not iterable".
    with pytest.raises(InvalidArgumentError) as single:
        await client.publish("a", "k", {}, headers)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as batch:
        await client.publish_batch([Publish("a", "k", {}, headers)])  # type: ignore[arg-type]
    for error in (single.value, batch.value):
        assert str(error).startswith(
            f"message to stream a/k: headers {headers!r} ({type(headers).__name__}): "
            "expected a mapping of header names to values (str to str); nothing was sent"
        ), str(error)
    assert stored(client) == {}


@pytest.mark.parametrize("items", [Publish("a", "k", {}), None, 5])
async def test_a_batch_that_is_not_an_iterable_of_publishes_is_refused_in_one_line(
    client: Client, items: object,
) -> None:
    # Was "TypeError: 'Publish' object is not iterable": one Publish given as the batch.
    with pytest.raises(InvalidArgumentError) as refused:
        await client.publish_batch(items)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"publish_batch: expected an iterable of conveyor.Publish, got "
        f"{type(items).__name__} {items!r:.80}; nothing was sent")
    assert stored(client) == {}


async def test_a_client_used_from_another_event_loop_refuses_at_once(client: Client) -> None:
    # A plain `def` handler's thread that ran `asyncio.run(client.publish(...))` on the
    # daemon's client: on Redis the publish joined the daemon loop's round ("got Future
    # attached to a different loop") after storing the message — its retry stored it
    # again — and left a connection of the dead loop in the pool ("ack failed:
    # RuntimeError: Event loop is closed"); here the memory adapter stored it.
    await client.publish("a", "k", {"i": 0})  # the client's loop: this one
    errors: list[BaseException] = []

    def from_a_thread() -> None:
        for send in (lambda: client.publish("a", "k", {"i": 1}),
                     lambda: client.publish_batch([Publish("a", "k", {"i": 2})])):
            try:
                asyncio.run(send())
            except ConveyorError as exc:
                errors.append(exc)

    thread = threading.Thread(target=from_a_thread)
    thread.start()
    thread.join(10)
    assert [str(e) for e in errors] == [
        "this Client belongs to another event loop, which holds its connections (a "
        "plain `def` handler's thread, or a second asyncio.run()): await its publishes "
        "on that loop — declare the handler `async def`, or from a thread hand them to "
        "it with asyncio.run_coroutine_threadsafe(client.publish(...), loop); nothing "
        "was sent"] * 2
    assert [m[2] for m in stored(client).values()] == ["k"]
    await client.publish("a", "k", {"i": 3})  # its own loop is still served
    assert len(stored(client)) == 2


async def test_a_header_named_body_is_refused_before_anything_is_sent(client: Client) -> None:
    # `body` is a name of the wire format (Redis: the payload's field), as docs/concepts.md
    # says; the client let it through, so the memory and Kafka adapters stored it, and on
    # Redis the adapter refused it mid-send: a publish_batch stored the other queues'
    # messages (PartialPublishError), and single publishes gathered into its round
    # failed with it.
    good = [Publish("a", f"k{i}", {"i": i}) for i in range(8)]
    with pytest.raises(InvalidArgumentError, match=r"\['body'\] are reserved"):
        await client.publish("a", "k", {}, {"body": "x"})
    with pytest.raises(InvalidArgumentError, match=r"\['body'\] are reserved"):
        await client.publish_batch([*good, Publish("a", "k", {}, {"body": "x"})])
    assert stored(client) == {}


def test_a_sync_client_refuses_a_batch_that_is_no_iterable_as_the_client_does() -> None:
    # Was "TypeError: 'int' object is not iterable", from SyncClient's own list(items).
    reset_broker("sync-batch")
    with SyncClient(msgspec.convert({"memory": {"broker": "sync-batch"}}, Config)) as sync:
        with pytest.raises(InvalidArgumentError, match="expected an iterable of conveyor"):
            sync.publish_batch(5)  # type: ignore[arg-type]
        tokens = sync.publish_batch(Publish("a", str(i), {}) for i in range(3))
        assert len(tokens) == 3


async def test_headers_past_their_bound_are_refused_naming_the_largest(client: Client) -> None:
    # max_body_bytes counted the body alone: a message of 10 MB of headers went to the
    # broker (past Redis' 512 MB argument limit, a cut connection, not an error saying so).
    client.max_body_bytes = 100
    at_most = {"a": "x" * (MAX_HEADER_BYTES - 5), "tag": "y"}  # 65,536 bytes: taken
    await client.publish("a", "k", {}, at_most)
    over = {"small": "v", "big": "x" * 10_000_000}
    accented = {"é": "é" * (MAX_HEADER_BYTES // 2)}  # bytes counted, not characters
    for headers, named in ((over, "'big' (10,000,003 bytes)"),
                           (accented, "'é' (65,538 bytes)")):
        with pytest.raises(MessageTooLargeError) as single:
            await client.publish("a", "k", {}, headers)
        with pytest.raises(MessageTooLargeError) as batch:
            await client.publish_batch([Publish("a", "k", {}), Publish("a", "k", {}, headers)])
        for error in (single.value, batch.value):
            text = str(error)
            assert text.startswith("message to stream a/k: its headers hold "), text
            assert f"the largest {named}" in text and "nothing was sent" in text, text
            assert "65,536" in text and "\n" not in text and len(text) < 400, text
    assert len(stored(client)) == 1


@pytest.mark.parametrize(("namespace", "key", "fault"), [
    ("a\x00b", "k", r"stream 'a\x00b'/'k': its namespace holds a control character ('\x00')"),
    ("orders\nforged", "k", r"its namespace holds a control character ('\n')"),
    ("a\x7f", "k", r"its namespace holds a control character ('\x7f')"),
    ("n" * 100_000, "k",
     f"'{'n' * 100}'… (100,000 characters)/'k': its namespace is longer than 255 characters,"),
    ("a", "k" * 100_000, "its stream key is longer than 1,024 characters,"),
])
async def test_a_namespace_not_one_short_line_and_a_huge_key_are_refused(
    client: Client, namespace: str, key: str, fault: str,
) -> None:
    # Namespaces with a NUL, a newline or 100 kB went to the broker (and into every
    # log line, metrics label and dead letter naming them); a 100 kB key was remembered
    # by the client, and by every agent's lanes, for each of 65,536 streams.
    with pytest.raises(InvalidArgumentError, match=re.escape(fault)) as single:
        await client.publish(namespace, key, {})
    with pytest.raises(InvalidArgumentError, match=re.escape(fault)) as batch:
        await client.publish_batch([Publish("a", "k", {}), Publish(namespace, key, {})])
    for error in (single.value, batch.value):
        text = str(error)
        assert "\n" not in text and len(text) < 400 and "nothing was sent" in text, text
    assert stored(client) == {}
    # the longest of each, and a key of any text (control characters are data there)
    for namespace, key in (("n" * 255, "k"), ("a", "k" * 1024), ("a", "k\x00\n\x1b")):
        await client.publish(namespace, key, {})
    assert len(stored(client)) == 3


async def test_an_empty_content_type_is_the_default(client: Client) -> None:
    # As every adapter reads an empty content-type field (the memory adapter too).
    await client.publish("a", "k", b"{}", content_type="")
    await client.publish_batch([Publish("a", "k", {"x": 1}, content_type="")])
    adapter = client.adapter
    assert isinstance(adapter, MemoryAdapter)
    got = [(m.body, m.content_type) for log in adapter.broker.logs.values() for m in log.items]
    assert got == [(b"{}", "application/json"), (b'{"x":1}', "application/json")]


async def test_a_header_with_an_empty_name_is_refused_as_the_cli_refuses_it(
        client: Client) -> None:
    # `conveyor publish -H =v` is a usage error; the client sent the header "" along.
    with pytest.raises(InvalidArgumentError) as single:
        await client.publish("a", "k", {}, {"tenant": "acme", "": "v"})
    with pytest.raises(InvalidArgumentError) as batch:
        await client.publish_batch([Publish("a", "k", {}), Publish("a", "k", {}, {"": "v"})])
    for error in (single.value, batch.value):
        assert str(error) == ("message to stream a/k: a header has an empty name (its value "
                              "'v'): a header's name is non-empty text; nothing was sent")
    assert stored(client) == {}


@pytest.mark.parametrize("content_type", [None, "application/msgpack", "text/plain"])
async def test_a_body_of_none_is_refused_as_a_type_error_naming_the_argument(
        client: Client, content_type: str | None) -> None:
    # Was sent as JSON null (msgpack nil): a body left out or a function's missing
    # return, which every handler but one of `T | None` dead-letters.
    with pytest.raises(TypeError) as single:
        await client.publish("a", "k", None, content_type=content_type)
    with pytest.raises(TypeError) as batch:
        await client.publish_batch([Publish("a", "k", {}),
                                    Publish("a", "k", None, content_type=content_type)])
    for error in (single.value, batch.value):
        assert isinstance(error, BodyEncodeError)
        assert str(error) == (
            "message to stream a/k: body is None, which is no message: pass the body "
            "(to send JSON's null, pass b'null'); nothing was sent")
    assert stored(client) == {}
    await client.publish("a", "k", b"null")  # JSON's null, said so
    assert len(stored(client)) == 1


class Shade(enum.Enum):
    RED = 1


@pytest.mark.parametrize(("body", "key"), [
    ({1: "a", "1": "b"}, '"1"'),
    ({"lines": [{"sku": "x"}, {2: "int", "2": "str"}]}, '"2"'),
    ({1.5: "float", "1.5": "str"}, '"1.5"'),
    ({Shade.RED: "enum", 1: "int"}, '"1"'),
    ([Line("a", 1.0), {"n": {7: 1, "7": 2}}], '"7"'),
], ids=["int-str", "nested", "float-str", "enum-int", "in-a-list"])
async def test_keys_that_json_writes_alike_are_refused_not_one_lost(
        client: Client, body: object, key: str) -> None:
    # JSON's keys are text: {1: "a", "1": "b"} was sent as {"1":"a","1":"b"}, which
    # every decoder reads as {"1": "b"}: one key lost without a word.
    with pytest.raises(BodyEncodeError) as single:
        await client.publish("a", "k", body)
    with pytest.raises(BodyEncodeError) as batch:
        await client.publish_batch([Publish("a", "k", {"i": 1}), Publish("a", "k", body)])
    for error in (single.value, batch.value):
        assert str(error) == (
            f"message to stream a/k: its body cannot be encoded as JSON: two keys of one "
            f"object are both {key} there (JSON's keys are text), one would be lost; nothing "
            "was sent: give an object's keys one type, or publish it as application/msgpack")
    assert stored(client) == {}


async def test_keys_that_are_no_str_and_write_apart_go_and_msgpack_keeps_their_types(
        client: Client) -> None:
    await client.publish("a", "k", {3: "a", 2.5: "b", Shade.RED: "c", "x": "d"})
    await client.publish("a", "k", {1: "a", "1": "b", None: "c", (1, 2): "d", False: "e"},
                         content_type="application/msgpack")
    adapter = client.adapter
    assert isinstance(adapter, MemoryAdapter)
    [log] = [log for log in adapter.broker.logs.values() if log.items]
    assert msgspec.json.decode(log.items[0].body) == {"3": "a", "2.5": "b", "1": "c",
                                                      "x": "d"}
    assert msgspec.msgpack.decode(log.items[1].body) == {
        1: "a", "1": "b", None: "c", (1, 2): "d", False: "e"}
    # In a batch too; a msgspec.Raw's spaces are no key written twice.
    await client.publish_batch([Publish("a", "k", {"i": 1}), Publish("a", "k", {1: "a"}),
                                Publish("a", "k", {2: msgspec.Raw(b'{ "a" : 1 }')})])
    assert [msgspec.json.decode(m.body) for m in log.items[2:]] == [
        {"i": 1}, {"1": "a"}, {"2": {"a": 1}}]


@pytest.mark.parametrize("body", [{None: 1}, {True: 1}, {(1, 2): 1}, {frozenset(): 1}],
                         ids=["none", "bool", "tuple", "frozenset"])
async def test_keys_json_has_no_text_for_are_refused(client: Client, body: object) -> None:
    with pytest.raises(BodyEncodeError) as raised:
        await client.publish("a", "k", body)
    assert str(raised.value).startswith(
        "message to stream a/k: its body cannot be encoded as JSON: Only dicts with str-like "
        "or number-like keys are supported")
    assert stored(client) == {}


def test_a_publish_is_a_hashable_value_whatever_its_body() -> None:
    # It raised TypeError: unhashable type 'dict' (its headers' default, a dict body).
    items = [Publish("a", "k", {"i": 1}), Publish("a", "k", {"i": 1}),
             Publish("a", "k", {"i": 2}), Publish("a", "k", b"x", {"h": "v"}),
             Publish("a", "k", b"x", {"h": "v"}), Publish("a", "k2", {"i": 1})]
    assert hash(items[0]) == hash(items[1]) and hash(items[3]) == hash(items[4])
    assert set(items) == {items[0], items[2], items[3], items[5]}
    assert items[0] != items[2]  # equal as before: every field
