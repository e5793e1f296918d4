import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import StreamId
from conveyor.platform.mapper import RING_SIZE, HashRingQueueMapper, RingRange, stable_hash32

# Golden values, computed once (BLAKE2b-32 of namespace NUL key). A change here would
# silently re-route every stream of a running deployment: producers and daemons of
# different versions must agree, so these literals must never be updated casually.
GOLDEN_HASHES = {
    ("orders", "order-1"): 2456187991,
    ("orders", "order-2"): 788208844,
    ("payments", "customer-42"): 4131288374,
    ("", "x"): 708715466,
    ("ns", "ключ"): 2003661990,
}
GOLDEN_QUEUES_OF_8 = [5, 1, 0, 3, 1, 7, 1, 7, 4, 0, 4, 1, 2, 4, 0, 3]  # orders/o0..o15
GOLDEN_QUEUES_OF_3 = [2, 0, 0, 1, 0, 2, 0, 2, 1, 0, 1, 0, 1, 1, 0, 1]


def test_hash_is_pinned_so_producers_in_any_process_and_version_agree() -> None:
    for (ns, key), value in GOLDEN_HASHES.items():
        assert stable_hash32(ns, key) == value, (ns, key)
    for total, golden in ((8, GOLDEN_QUEUES_OF_8), (3, GOLDEN_QUEUES_OF_3)):
        mapper = HashRingQueueMapper(total)
        assert [mapper.queue_for(StreamId("orders", f"o{i}")) for i in range(16)] == golden
        assert [mapper.queue_for_key("orders", f"o{i}") for i in range(16)] == golden
    code = (
        "from conveyor.platform.mapper import stable_hash32;"
        "print(stable_hash32('orders', 'order-1'))"
    )
    for seed in ("0", "1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        assert int(out) == GOLDEN_HASHES[("orders", "order-1")]


def test_namespace_and_key_are_not_confused() -> None:
    assert stable_hash32("ab", "c") != stable_hash32("a", "bc")


@given(st.text(min_size=1), st.text(), st.integers(min_value=1, max_value=512))
def test_every_stream_maps_to_one_valid_queue_deterministically(
    ns: str, key: str, total: int
) -> None:
    mapper = HashRingQueueMapper(total)
    queue = mapper.queue_for(StreamId(ns, key))
    assert 0 <= queue < total
    assert HashRingQueueMapper(total).queue_for(StreamId(ns, key)) == queue


def test_spread_is_within_five_percent_of_even_for_100k_streams() -> None:
    # Each queue's expected share is n/q; with n=100k, q=8 the standard deviation is
    # about 105, so +-5% (625) is a six-sigma bound: a failure means a biased ring.
    mapper = HashRingQueueMapper(8)
    counts = Counter(mapper.queue_for_key("orders", f"order-{i}") for i in range(100_000))
    mean = 100_000 / 8
    assert set(counts) == set(range(8))
    assert max(abs(c - mean) / mean for c in counts.values()) < 0.05


STREAMS_PER_QUEUE = 400


@settings(max_examples=40, deadline=None)
@given(total=st.integers(min_value=1, max_value=64), namespace=st.text(max_size=20))
def test_spread_is_within_thirty_percent_of_even_for_any_queue_count_and_namespace(
    total: int, namespace: str
) -> None:
    # 400 streams per queue: each queue's count is Binomial(400q, 1/q), mean 400 and
    # standard deviation at most 20, so +-30% (120) is a six-sigma bound per queue
    # (under 1e-5 for 64 queues over every example): a failure means a biased ring.
    mapper = HashRingQueueMapper(total)
    n = STREAMS_PER_QUEUE * total
    counts = Counter(mapper.queue_for_key(namespace, f"key-{i}") for i in range(n))
    assert set(counts) == set(range(total)), "every queue gets streams"
    worst = max(abs(counts[q] - STREAMS_PER_QUEUE) for q in range(total))
    assert worst <= 0.30 * STREAMS_PER_QUEUE, (total, namespace, counts)


def test_queue_positions_are_evenly_spaced_and_cover_the_ring() -> None:
    mapper = HashRingQueueMapper(4)
    assert [mapper.position(q) for q in range(4)] == [0, RING_SIZE // 4, RING_SIZE // 2,
                                                       3 * RING_SIZE // 4]
    assert mapper.queue_for_hash(0) == 0
    assert mapper.queue_for_hash(RING_SIZE // 4 - 1) == 0
    assert mapper.queue_for_hash(RING_SIZE // 4) == 1
    assert mapper.queue_for_hash(RING_SIZE - 1) == 3


def test_queues_for_range_handles_wrapping_ranges() -> None:
    mapper = HashRingQueueMapper(4)
    assert mapper.queues_for_range(RingRange(0, RING_SIZE // 2)) == [0, 1]
    assert mapper.queues_for_range(RingRange(RING_SIZE // 2 + 1, 1)) == [0, 3]


def test_zero_queues_is_rejected() -> None:
    import pytest

    with pytest.raises(ValueError, match="total_queues"):
        HashRingQueueMapper(0)


@pytest.mark.parametrize("total", [0, -1, 4097, 10**9, 1.5, "8", True, None])
def test_a_queue_count_out_of_range_or_not_an_int_is_refused_in_one_line(total: object) -> None:
    # 10**9 built a list of a billion bounds (the process ran out of memory, silently);
    # 1.5 and "8" failed inside as TypeErrors; True made a one-queue ring.
    with pytest.raises(InvalidArgumentError) as refused:
        HashRingQueueMapper(total)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"total_queues must be an int from 1 to 4096 ([queues] total), got {total!r}")
