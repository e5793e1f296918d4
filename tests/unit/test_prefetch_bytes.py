"""The queue cache's byte bound: how many messages a pull asks for, and the daemon's
budget shared by the agents pulling."""

from __future__ import annotations

from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message
from conveyor.platform.queue_cache import Entry, PrefetchBudget, QueueCache

MIB = 1 << 20


def pulled(cache: QueueCache, count: int, body: int) -> None:
    msgs = [Message(f"m{i}", StreamId("ns", f"k{i}"), b"x" * body,
                    token=SequenceToken(0, i)) for i in range(count)]
    cache.took(msgs)
    cache.entries.extend(Entry(m, 1) for m in msgs)


def test_the_first_pull_asks_for_one_message_to_learn_the_body_size() -> None:
    assert QueueCache(1024).pull_size(256, 8 * MIB) == 1


def test_pulls_ask_for_what_fits_in_the_bytes_left_at_the_last_body_size() -> None:
    cache = QueueCache(1024)
    pulled(cache, 1, MIB)
    assert cache.bytes == MIB
    assert cache.pull_size(256, 8 * MIB) == 7
    pulled(cache, 7, MIB)
    assert cache.pull_size(256, 8 * MIB) == 0  # full in bytes: wait for acknowledgements


def test_small_bodies_are_bounded_by_count_and_max_batch_as_before() -> None:
    cache = QueueCache(100)
    pulled(cache, 10, 100)
    assert cache.pull_size(256, 8 * MIB) == 90
    assert cache.pull_size(50, 8 * MIB) == 50


def test_acknowledged_entries_free_their_bytes() -> None:
    cache = QueueCache(1024)
    pulled(cache, 8, MIB)
    for entry in list(cache.entries)[:5]:
        entry.done = True
    tokens: list[SequenceToken] = []
    cache.pop_done_prefix(tokens)
    assert len(tokens) == 5 and cache.bytes == 3 * MIB
    assert cache.pull_size(256, 8 * MIB) == 5


def test_an_empty_cache_takes_one_body_larger_than_its_share() -> None:
    cache = QueueCache(1024)
    pulled(cache, 1, 4 * MIB)
    assert cache.pull_size(256, MIB) == 0  # holding one: nothing more
    cache.entries[0].done = True
    cache.pop_done_prefix([])
    assert cache.pull_size(256, MIB) == 1  # empty: one, however large


def test_the_expected_size_rises_at_once_and_falls_by_halves() -> None:
    cache = QueueCache(10_000)
    pulled(cache, 1, 1000)
    pulled(cache, 1, MIB)
    cache.entries.clear()
    cache.bytes = 0
    assert cache.pull_size(10_000, 8 * MIB) == 8
    pulled(cache, 1, 1000)  # small again: the estimate halves, not drops
    cache.entries.clear()
    cache.bytes = 0
    assert cache.pull_size(10_000, 8 * MIB) == 16


def test_the_daemons_budget_is_shared_evenly_by_the_agents_pulling() -> None:
    budget = PrefetchBudget(64 * MIB)
    assert budget.share_bytes == 64 * MIB
    budget.pullers = 8
    assert budget.share_bytes == 8 * MIB
