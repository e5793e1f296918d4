"""The demo's summary is counted from ids, so a drop or a redelivery shows in it."""

from collections import Counter

from conveyor.examples.demo import summarize


def test_a_clean_run_sums_to_what_was_published() -> None:
    result = summarize(range(10), Counter(range(8)), [8, 9])
    assert (result.published, result.handled, result.dead_lettered) == (10, 8, 2)
    assert result.lost == 0 and result.duplicates == 0


def test_a_dropped_message_is_lost_and_a_redelivered_one_is_a_duplicate() -> None:
    handled = Counter(range(10))
    del handled[4]  # dropped: never handled, never dead-lettered
    handled[7] += 1  # redelivered after it was handled
    result = summarize(range(10), handled, [])
    assert result.lost == 1
    assert result.duplicates == 1
    assert result.handled == 9


def test_counts_do_not_offset_each_other() -> None:
    # One drop and one duplicate leave the handled *count* at N: arithmetic on counts
    # (published - handled - dead) would report nothing wrong.
    handled = Counter({i: 1 for i in range(10) if i != 3})
    handled[5] += 1
    assert sum(handled.values()) == 10
    result = summarize(range(10), handled, [])
    assert (result.lost, result.duplicates) == (1, 1)


def test_handled_then_dead_lettered_counts_as_a_duplicate_not_as_two_messages() -> None:
    result = summarize(range(4), Counter({0: 1, 1: 1, 2: 1}), [2, 3, 3])
    assert result.handled == 3
    assert result.dead_lettered == 2
    assert result.duplicates == 2  # 2 handled and dead-lettered, 3 dead-lettered twice
    assert result.lost == 0
    assert "lost=0 " in result.summary() and "duplicates=2 " in result.summary()
