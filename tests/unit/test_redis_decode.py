"""The Redis receiver's positional decoder agrees with the field-dict one, entry for entry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.adapters.redis.codec import (
    PUBLISH_CHUNK_BYTES,
    EntryDecoder,
    decode_entry,
    encode_fields,
    publish_chunks,
    undecodable_entry,
)
from conveyor.adapters.redis.keys import joined_ids
from conveyor.platform.errors import DecodeError, InvalidArgumentError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message, Undecodable


def _flat(fields: dict[bytes | str, bytes | str]) -> list[bytes]:
    def b(x: bytes | str) -> bytes:
        return x if isinstance(x, bytes) else x.encode()

    return [b(x) for k, v in fields.items() for x in (k, v)]


WIRE = {b"cv-ns", b"cv-key", b"cv-id", b"content-type", b"cv-ts", b"cv-attempt", b"body"}


def _by_dict(queue: int, eid: bytes, flat: list[bytes]) -> Message:
    """The reference reading: a wire field given twice with different values is no
    message; otherwise the field dict (a repeated user header: its last value)."""
    pairs = list(zip(flat[0::2], flat[1::2], strict=False))
    try:
        for name in WIRE:
            if len({v for n, v in pairs if n == name}) > 1:
                raise DecodeError(f"{name!r} given twice")
        return decode_entry(queue, eid, dict(pairs))
    except Exception as exc:
        return undecodable_entry(queue, eid, flat, exc)


def _same(a: Message, b: Message) -> bool:
    """Equal messages, or both undecodable with the same raw fields (the reasons may
    name different first faults)."""
    if isinstance(a, Undecodable) or isinstance(b, Undecodable):
        return (isinstance(a, Undecodable) and isinstance(b, Undecodable)
                and a.raw_fields == b.raw_fields and a.token == b.token)
    return a == b


text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
names = st.sampled_from(
    [b"cv-ns", b"cv-key", b"cv-id", b"content-type", b"cv-ts", b"cv-attempt", b"body", b"x-h"]
)


@given(
    ns=text.filter(bool), key=text, ident=text, body=st.binary(max_size=16),
    ctype=st.sampled_from(["application/json", "text/plain", ""]),
    attempt=st.integers(0, 5), ts=st.integers(0, 2**41),
    headers=st.dictionaries(text.filter(lambda s: s != "body" and not s.startswith("cv-")
                                        and s != "content-type"), text, max_size=3),
    ms=st.integers(0, 2**45), seq=st.integers(0, 2**20),
)
def test_published_entries_decode_alike(
    ns: str, key: str, ident: str, body: bytes, ctype: str, attempt: int, ts: int,
    headers: dict[str, str], ms: int, seq: int,
) -> None:
    msg = Message(ident, StreamId(ns, key), body, headers, ctype, attempt, ts)
    flat = _flat(encode_fields(msg))
    eid = b"%d-%d" % (ms, seq)
    decoder = EntryDecoder(5)
    got = decoder.decode(eid, flat)
    assert got == _by_dict(5, eid, flat)
    assert decoder.decode(eid, flat) == got  # interned stream / content type: same again


LAYOUT = [b"cv-ns", b"n", b"cv-key", b"k", b"cv-id", b"i", b"content-type", b"", b"cv-ts", b"",
          b"body", b"{}"]
values = st.sampled_from([b"", b"7", b"abc", b"12"])


@given(
    laid_out=st.booleans(),
    pairs=st.lists(st.tuples(names, values), max_size=10),
)
def test_arbitrary_field_lists_decode_alike(
    laid_out: bool, pairs: list[tuple[bytes, bytes]]
) -> None:
    # laid_out: the positional path's prefix, then anything (repeats, bad numbers...).
    flat = (LAYOUT if laid_out else []) + [x for pair in pairs for x in pair]
    eid = b"1700000000000-3"

    assert _same(EntryDecoder(0).decode(eid, flat), _by_dict(0, eid, flat))


@given(fields=st.lists(st.tuples(st.binary(max_size=12) | names, st.binary(max_size=12)),
                       max_size=12))
def test_any_entry_decodes_to_a_message_or_an_undecodable_keeping_its_bytes(
    fields: list[tuple[bytes, bytes]],
) -> None:
    flat = [x for pair in fields for x in pair]
    got = EntryDecoder(3).decode(b"1700000000000-7", flat)  # never raises
    assert got.token == SequenceToken(3, 1700000000000, 7)
    if isinstance(got, Undecodable):
        assert got.raw_fields == tuple(fields) and got.reason
        assert got.stream.namespace == ""  # no handler can take it: it is dead-lettered
    else:
        assert got.stream.namespace  # a message always names its handlers' namespace


@pytest.mark.parametrize(
    ("field", "value", "fault"),
    [
        (b"cv-attempt", b"abc", "cv-attempt is not a whole number"),
        (b"cv-attempt", b"-1", "cv-attempt is not a whole number"),
        (b"cv-ts", b"99999999999999999999999", "cv-ts is not a whole number"),
        (b"cv-ts", b" 12", "cv-ts is not a whole number"),
        # the field not UTF-8 named (was Python's "'utf-8' codec can't decode byte 0xc3")
        (b"cv-ns", b"\xc3\x28", "DecodeError: field 'cv-ns' is not UTF-8 text: b'\\xc3('"),
        (b"cv-key", b"\xff", "DecodeError: field 'cv-key' is not UTF-8 text: b'\\xff'"),
        (b"cv-id", b"\xff", "DecodeError: field 'cv-id' is not UTF-8 text"),
        (b"content-type", b"\xff", "DecodeError: field 'content-type' is not UTF-8 text"),
        (b"x-h", b"\xc3\x28", "DecodeError: field 'x-h' is not UTF-8 text"),
        (b"\xff", b"v", "DecodeError: a field's name is not UTF-8 text: b'\\xff'"),
        (b"cv-ns", b"", "no cv-ns field"),
    ],
)
def test_malformed_metadata_is_isolated_with_its_reason(
    field: bytes, value: bytes, fault: str
) -> None:
    base = {b"cv-ns": b"good", b"cv-key": b"k", b"body": b"{}"}
    flat = [*_flat({n: v for n, v in base.items() if n != field}), field, value]
    got = EntryDecoder(0).decode(b"5-0", flat)
    assert isinstance(got, Undecodable) and fault in got.reason
    assert got.body == b"{}" and (field, value) in got.raw_fields


@pytest.mark.parametrize("laid_out", [False, True])
@pytest.mark.parametrize(("field", "first", "second"), [
    (b"cv-ns", b"good", b"other"),  # was handled under the last one's handlers
    (b"body", b'{"n": 1}', b'{"n": 2}'),  # was handled with the last body; the first lost
    (b"cv-attempt", b"", b"3"),  # the positional path read the first, the dict the last
    (b"cv-key", b"k", b"j"),
])
def test_a_wire_field_given_twice_with_different_values_is_undecodable(
    laid_out: bool, field: bytes, first: bytes, second: bytes,
) -> None:
    base = {b"cv-ns": b"good", b"cv-key": b"k", b"cv-id": b"i", b"content-type": b"",
            b"cv-ts": b"1", b"body": b"{}"}
    if laid_out:  # the positional path's layout, then the field again
        flat = _flat({**base, field: first})
    else:  # the field first, then what a message needs
        rest = {b"body": b"{}", b"cv-ns": b"good"}
        flat = [field, first, *_flat({n: v for n, v in rest.items() if n != field})]
    flat += [field, second]
    got = EntryDecoder(0).decode(b"5-0", flat)
    assert isinstance(got, Undecodable), got
    assert got.reason == (f"DecodeError: {field.decode()} given twice with different values "
                          f"({first!r}, then {second!r}): which one is meant is not known")
    assert got.raw_fields == tuple(zip(flat[0::2], flat[1::2], strict=True))
    same = EntryDecoder(0).decode(b"5-1", [*flat[:-1], first])  # the same value twice
    assert not isinstance(same, Undecodable) and same.stream.namespace == "good"


def test_an_entry_without_a_body_field_is_undecodable() -> None:
    # It was handled as an empty body; an empty body is an empty field.
    flat = [b"cv-ns", b"good", b"cv-key", b"k"]
    got = EntryDecoder(0).decode(b"5-0", flat)
    assert isinstance(got, Undecodable) and "no body field" in got.reason
    assert got.raw_fields == ((b"cv-ns", b"good"), (b"cv-key", b"k"))
    empty = EntryDecoder(0).decode(b"5-1", [*flat, b"body", b""])
    assert not isinstance(empty, Undecodable) and empty.body == b""


def test_joined_ids_are_the_entry_ids() -> None:
    tokens = [SequenceToken(1, 1700000000000, 0), SequenceToken(1, 1700000000001, 12)]
    assert joined_ids(tokens) == b"1700000000000-0 1700000000001-12"


@pytest.mark.parametrize(
    "name", ["cv-ns", "cv-key", "cv-id", "content-type", "cv-ts", "cv-attempt", "body"]
)
def test_a_header_named_like_a_wire_field_is_refused_at_publish(name: str) -> None:
    # Written as is, it would come back as metadata (or the body), not as a header.
    # The caller's mistake, not the broker's: InvalidArgumentError (`conveyor publish
    # -H body=1` exits 2), not a BrokerError a caller would retry.
    msg = Message("m1", StreamId("n", "k"), b"{}", {"x-ok": "1", name: "spoof"})
    with pytest.raises(InvalidArgumentError, match=f"header '{name}' is reserved"):
        encode_fields(msg)


def test_headers_that_only_look_alike_pass_through() -> None:
    headers = {"Body": "a", "cv-nsx": "b", "x-cv-id": "c", "traceparent": "d"}
    msg = Message("m1", StreamId("n", "k"), b"{}", headers)
    flat = _flat(encode_fields(msg))
    assert EntryDecoder(0).decode(b"1-0", flat).headers == headers


TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
EXTRAS: list[tuple[bytes, ...]] = [
    (), (b"x-h", b"v"), (b"traceparent", TRACEPARENT), (b"traceparent", TRACEPARENT, b"x-2", b""),
    (b"x-h", b"a", b"x-h", b"b"), (b"cv-attempt", b"2"), (b"x-h", b"v", b"cv-ns", b"other"),
    (b"x-h", b"\xff"), (b"x-h",),
]
"""Fields after the layout: user headers (one, several, repeated), an attempt, a
repeated field, a header that is not UTF-8, an odd field count."""


@given(
    entries=st.lists(st.tuples(
        st.integers(0, 2**45), st.integers(0, 2**20), text.filter(bool), text, text,
        st.sampled_from([b"", b"7", b"0", b"007", b"1700000000000", b"12x",
                         b"99999999999999999999"]),
        st.sampled_from([b"", b"application/json", b"text/plain", b"\xff"]),
        st.sampled_from(EXTRAS),
    ), max_size=6),
)
def test_a_reply_decodes_as_its_entries_one_by_one(
    entries: list[tuple[int, int, str, str, str, bytes, bytes, tuple[bytes, ...]]],
) -> None:
    # The batch path (all entries in the layout, user headers after it, numbers read in
    # one call) and its fall-backs (a bad number, leading zeros, a bad content type, an
    # attempt or a repeated field after the layout, a header that is not UTF-8, an entry
    # without fields) give what decoding each entry gives.
    reply: list[tuple[bytes, list[bytes]]] = []
    for ms, seq, ns, key, ident, ts, ctype, extra in entries:
        flat = [b"cv-ns", ns.encode(), b"cv-key", key.encode(), b"cv-id", ident.encode(),
                b"content-type", ctype, b"cv-ts", ts, b"body", b"{}"]
        reply.append((b"%d-%d" % (ms, seq), [*flat, *extra]))
    reply.append((b"1-1", []))  # trimmed while pending: no message
    one_by_one = [EntryDecoder(2).decode(eid, fl) for eid, fl in reply if fl]
    got = EntryDecoder(2).decode_all(reply)
    assert len(got) == len(one_by_one)
    assert all(_same(a, b) for a, b in zip(got, one_by_one, strict=True))


def test_user_headers_stay_on_the_batch_path() -> None:
    """A traceparent on every message (tracing on) no longer sends a reply entry by
    entry: its stream ids are interned as on the common reply."""
    msgs = [Message(f"m{i}", StreamId("orders", "o-1"), b"{}",
                    {"traceparent": TRACEPARENT.decode()}, "application/json", 0,
                    1_700_000_000_000 + i) for i in range(3)]
    reply = [(b"1700000000005-%d" % i, _flat(encode_fields(m))) for i, m in enumerate(msgs)]
    class BatchOnly(EntryDecoder):
        def decode(self, eid: bytes, fl: list[bytes]) -> Message:
            raise AssertionError("decoded entry by entry")

    got = BatchOnly(4).decode_all(reply)
    assert got[0].stream is got[1].stream is got[2].stream
    assert [m.headers for m in got] == [m.headers for m in msgs]
    assert [m.token for m in got] == [SequenceToken(4, 1700000000005, i) for i in range(3)]


def test_a_common_reply_shares_its_stream_ids_and_reads_every_number() -> None:
    msgs = [Message(f"m{i}", StreamId("orders", "o-1"), b"{}", {}, "application/json", 0,
                    1_700_000_000_000 + i) for i in range(3)]
    reply = [(b"1700000000005-%d" % i, _flat(encode_fields(m))) for i, m in enumerate(msgs)]
    got = EntryDecoder(4).decode_all(reply)
    assert got[0].stream is got[1].stream is got[2].stream
    assert [m.token for m in got] == [SequenceToken(4, 1700000000005, i) for i in range(3)]
    assert [m.enqueued_at_ms for m in got] == [m.enqueued_at_ms for m in msgs]
    assert [m.id for m in got] == ["m0", "m1", "m2"]


def test_publish_chunks_count_headers_as_they_count_bodies() -> None:
    # Chunks were cut by body bytes alone: 1,000 messages of 60 KiB headers went in one
    # 60 MB script call, past the ~4 MiB a call is meant to hold.
    headers = {"sig": "x" * (60 << 10)}
    messages = [Message(f"m{i}", StreamId("a", "k"), b"{}", headers) for i in range(1000)]
    chunks = publish_chunks(messages)
    assert [m.id for chunk in chunks for m in chunk] == [m.id for m in messages]
    most = PUBLISH_CHUNK_BYTES // (2 + 3 + (60 << 10))  # whole messages per chunk
    assert [len(c) for c in chunks[:-1]] == [most] * (len(chunks) - 1)
    assert 0 < len(chunks[-1]) <= most
    # a message with more than a chunk's bytes still goes, alone
    big = Message("big", StreamId("a", "k"), b"x" * PUBLISH_CHUNK_BYTES, headers)
    assert [len(c) for c in publish_chunks([messages[0], big, messages[1]])] == [1, 1, 1]


def test_a_decoder_remembers_no_stream_whose_key_is_past_any_a_client_sends() -> None:
    # A foreign entry's cv-key is any bytes: a receiver interned each stream it read, key
    # and all, up to 4,096 of them; 200 entries of distinct 1 MB keys left ~400 MB held
    # by a worker after it had handled and acknowledged them all. Such a stream is read
    # as it is, not remembered; a stream a client can name still is.
    decoder = EntryDecoder(0)
    huge = [b"%03d" % i + b"k" * 100_000 for i in range(50)]
    for i, key in enumerate([*huge, b"o-1", b"o-1"]):
        flat = _flat(encode_fields(Message(f"m{i}", StreamId("ns", key.decode()), b"{}",
                                           enqueued_at_ms=1)))
        assert decoder.decode(b"1-%d" % i, flat).stream.key == key.decode()
        assert decoder.decode_all([[b"2-%d" % i, flat]])[0].stream.key == key.decode()
    remembered = decoder._streams
    assert sum(len(k) for _, k in remembered) < 10_000, len(remembered)
    first, again = (decoder.decode(b"3-%d" % i, _flat(encode_fields(
        Message("m", StreamId("ns", "o-1"), b"{}", enqueued_at_ms=1)))) for i in (0, 1))
    assert first.stream is again.stream  # interned
