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


def acknowledge(cache: QueueCache, count: int) -> None:
    for entry in list(cache.entries)[:count]:
        entry.pending = 0
    cache.pop_done_prefix([])


def joined(limit: int | PrefetchBudget, capacity: int = 1024) -> QueueCache:
    cache = QueueCache(capacity)
    cache.join(limit if isinstance(limit, PrefetchBudget) else PrefetchBudget(limit))
    return cache


def test_without_a_budget_only_the_count_bounds_a_pull() -> None:
    cache = QueueCache(1024)
    pulled(cache, 1, 100 * MIB)
    assert cache.pull_size(256) == 256


def test_the_first_pull_asks_for_one_message_to_learn_the_body_size() -> None:
    assert joined(8 * MIB).pull_size(256) == 1


def test_pulls_ask_for_what_fits_in_the_bytes_left_at_the_last_body_size() -> None:
    cache = joined(8 * MIB)
    pulled(cache, 1, MIB)
    assert cache.bytes == MIB
    assert cache.pull_size(256) == 7
    pulled(cache, 7, MIB)
    assert cache.pull_size(256) == 0 and cache.full  # wait for acknowledgements


def test_small_bodies_are_bounded_by_count_and_max_batch_as_before() -> None:
    cache = joined(8 * MIB, capacity=100)
    pulled(cache, 10, 100)
    assert cache.pull_size(256) == 90
    assert cache.pull_size(50) == 50


def test_acknowledged_entries_free_their_bytes_in_the_cache_and_the_budget() -> None:
    budget = PrefetchBudget(8 * MIB)
    cache = joined(budget)
    pulled(cache, 8, MIB)
    assert budget.held_bytes == 8 * MIB
    acknowledge(cache, 5)
    assert cache.bytes == budget.held_bytes == 3 * MIB
    assert cache.pull_size(256) == 5
    cache.leave()  # the pull loop ended: what is held stops counting
    assert budget.held_bytes == 0 and budget.pullers == 0


def test_an_empty_cache_takes_one_body_larger_than_its_share() -> None:
    cache = joined(MIB)
    pulled(cache, 1, 4 * MIB)
    assert cache.pull_size(256) == 0  # holding one: nothing more
    acknowledge(cache, 1)
    assert cache.pull_size(256) == 1  # empty: one, however large


def test_the_expected_size_rises_at_once_and_falls_by_halves() -> None:
    cache = joined(8 * MIB, capacity=10_000)
    pulled(cache, 1, 1000)
    pulled(cache, 1, MIB)
    acknowledge(cache, 2)
    assert cache.pull_size(10_000) == 8
    pulled(cache, 1, 1000)  # small again: the estimate halves, not drops
    acknowledge(cache, 1)
    assert cache.pull_size(10_000) == 16


def test_queues_share_the_daemons_budget_and_one_that_took_more_waits() -> None:
    budget = PrefetchBudget(8 * MIB)
    first = joined(budget)
    pulled(first, 1, MIB)
    pulled(first, 5, MIB)  # alone, it took 6 MiB of 8
    others = [joined(budget) for _ in range(3)]
    assert first.pull_size(256) == 0  # over its share of 2 MiB now
    pulled(others[0], 1, MIB)
    assert others[0].pull_size(256) == 1  # 1 MiB more: its share, and the daemon's last
    pulled(others[0], 1, MIB)
    assert others[1].pull_size(256) == 1  # empty: one message, over the daemon's limit
    pulled(others[1], 1, MIB)
    pulled(others[2], 1, 4 * MIB)  # empty too: one, however large
    acknowledge(first, 5)
    assert budget.held_bytes == 8 * MIB
    assert first.pull_size(256) == 0  # 1 MiB left of its share, none of the daemon's
    acknowledge(others[2], 1)
    assert first.pull_size(256) == 1


def test_headers_count_against_the_bound_as_bodies_do() -> None:
    """A backlog of small bodies with large headers (another producer may send many KB
    of them) stays under the bound: before, headers were not counted and a 64 KiB
    budget let the cache take its whole capacity, 1,024 messages of 8 KiB."""
    budget = PrefetchBudget(64 << 10)
    cache = joined(budget)
    headers = {f"x-h{i}": "v" * 1000 for i in range(8)}  # 8 headers, 8,032 characters
    size = 10 + sum(len(n) + len(v) for n, v in headers.items())
    backlog = [Message(f"m{i}", StreamId("ns", "k"), b"x" * 10, headers,
                       token=SequenceToken(0, i)) for i in range(1024)]
    taken = 0
    while (room := cache.pull_size(256)) > 0 and taken < len(backlog):
        cache.add_all(backlog[taken:taken + room], {})
        taken += room
    assert cache.bytes == budget.held_bytes == taken * size
    assert budget.held_bytes <= budget.limit_bytes + size  # the bound, plus one message
    assert taken == 8
    for entry in list(cache.entries)[:3]:  # freed one at a time (not every one is done)
        entry.pending = 0
    cache.pop_done_prefix([])
    assert cache.bytes == budget.held_bytes == 5 * size
    acknowledge(cache, 5)  # and in bulk
    assert cache.bytes == budget.held_bytes == 0
