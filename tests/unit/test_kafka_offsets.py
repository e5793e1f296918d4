"""The commit watermark and the done offsets above it (pure logic, no broker)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conveyor.adapters.kafka import offsets
from conveyor.adapters.kafka.offsets import DoneOffsets, decode, encode


def test_done_offsets_above_the_watermark_travel_as_ranges() -> None:
    assert encode(100, {102, 103, 104, 109}) == "cv1:2-4,9"
    assert decode(100, "cv1:2-4,9") == {102, 103, 104, 109}
    assert encode(100, set()) == ""


def test_foreign_or_broken_metadata_decodes_to_nothing() -> None:
    assert decode(5, "") == set()
    assert decode(5, "someone else's metadata") == set()
    assert decode(5, "cv1:3-x") == set()
    assert decode(5, "cv1:0") == set()


def test_metadata_too_long_drops_the_highest_offsets_only() -> None:
    done = set(range(1, 10_000, 2))
    text = encode(0, done, max_bytes=200)
    assert len(text) <= 200
    kept = decode(0, text)
    assert kept and kept <= done
    assert min(done) in kept


def test_the_watermark_never_passes_an_unfinished_offset() -> None:
    offsets = DoneOffsets(10)
    offsets.mark_done(12)
    offsets.mark_done(13)
    offsets.acknowledge_through(10)  # 11 still running
    assert offsets.watermark == 11
    assert offsets.metadata() == "cv1:1-2"
    offsets.acknowledge_through(11)
    assert offsets.watermark == 14 and offsets.metadata() == ""


def test_loaded_done_offsets_at_the_watermark_advance_it() -> None:
    offsets = DoneOffsets(7, {7, 8, 10})
    assert offsets.watermark == 9
    assert offsets.done == {10}


@given(st.integers(0, 10**12), st.sets(st.integers(1, 5000), max_size=300))
def test_encode_then_decode_is_identity_when_it_fits(watermark: int, rel: set[int]) -> None:
    done = {watermark + r for r in rel}
    assert decode(watermark, encode(watermark, done, max_bytes=10**6)) == done


def test_unfinished_counts_what_a_worker_can_still_read() -> None:
    """A group's lag (``status``, ``groups``, the scaler): records from its watermark to
    the high watermark, less those done above it — but not records retention deleted
    before the group handled them (below the log start), which no worker can read."""
    text = offsets.encode(100, [102, 103, 109])
    assert offsets.unfinished(120, 0, 100, text) == 20 - 3  # nothing deleted
    assert offsets.unfinished(120, 103, 100, text) == 17 - 2  # 100-102 gone; 103, 109 done
    assert offsets.unfinished(120, 110, 100, text) == 10  # every done offset gone too
    assert offsets.unfinished(120, 120, 100, text) == 0  # all of it deleted
    assert offsets.unfinished(120, 0, 120, "") == 0 and offsets.unfinished(125, 0, 120, "") == 5
    assert offsets.unfinished(105, 0, 100, offsets.encode(100, [104, 108])) == 4  # past high
