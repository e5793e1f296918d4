"""The Redis receiver's positional decoder agrees with the field-dict one, entry for entry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.adapters.redis import EntryDecoder, decode_entry, encode_fields, joined_ids
from conveyor.platform.errors import BrokerError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message


def _flat(fields: dict[bytes | str, bytes | str]) -> list[bytes]:
    def b(x: bytes | str) -> bytes:
        return x if isinstance(x, bytes) else x.encode()

    return [b(x) for k, v in fields.items() for x in (k, v)]


def _by_dict(queue: int, eid: bytes, flat: list[bytes]) -> Message:
    it = iter(flat)
    return decode_entry(queue, eid, dict(zip(it, it, strict=False)))


text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
names = st.sampled_from(
    [b"cv-ns", b"cv-key", b"cv-id", b"content-type", b"cv-ts", b"cv-attempt", b"body", b"x-h"]
)


@given(
    ns=text, key=text, ident=text, body=st.binary(max_size=16),
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

    def outcome(fn: object) -> object:
        try:
            return fn()  # type: ignore[operator]
        except ValueError as exc:  # a non-numeric cv-ts / cv-attempt
            return type(exc)

    assert outcome(lambda: EntryDecoder(0).decode(eid, flat)) == outcome(
        lambda: _by_dict(0, eid, flat)
    )


def test_joined_ids_are_the_entry_ids() -> None:
    tokens = [SequenceToken(1, 1700000000000, 0), SequenceToken(1, 1700000000001, 12)]
    assert joined_ids(tokens) == b"1700000000000-0 1700000000001-12"


@pytest.mark.parametrize(
    "name", ["cv-ns", "cv-key", "cv-id", "content-type", "cv-ts", "cv-attempt", "body"]
)
def test_a_header_named_like_a_wire_field_is_refused_at_publish(name: str) -> None:
    # Written as is, it would come back as metadata (or the body), not as a header.
    msg = Message("m1", StreamId("n", "k"), b"{}", {"x-ok": "1", name: "spoof"})
    with pytest.raises(BrokerError, match=f"header '{name}' is reserved"):
        encode_fields(msg)


def test_headers_that_only_look_alike_pass_through() -> None:
    headers = {"Body": "a", "cv-nsx": "b", "x-cv-id": "c", "traceparent": "d"}
    msg = Message("m1", StreamId("n", "k"), b"{}", headers)
    flat = _flat(encode_fields(msg))
    assert EntryDecoder(0).decode(b"1-0", flat).headers == headers
