"""Dead letters: stored per group and read back oldest first; listed under ids, found,
counted, deleted and replayed (what ``conveyor dlq`` needs). Every dead-letter promise
of the port lives in this one file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from conveyor.platform.adapter import DeadLetters, QueueAdapter
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import (
    CONTENT_MSGPACK,
    H_REPLAY_OF,
    DeadLetter,
    Message,
    now_ms,
)
from conveyor.platform.operations import dlq
from tests.contract.conftest import QUEUES, SERVER_ADAPTERS, Open, PutNonLetters
from tests.contract.support import take, take_rest


def letter(n: int, *, handler: str = "orders.handle") -> DeadLetter:
    message = Message(f"m{n}", StreamId("orders", f"k{n}"), f'{{"n": {n}}}'.encode(),
                      headers={"x-tenant": "t1"}, attempt=3, enqueued_at_ms=now_ms(),
                      token=SequenceToken(0, n))
    return DeadLetter(message, handler, "ValueError", f"bad order {n}", 3, now_ms())


async def test_dead_letters_are_read_back_as_stored_per_group_oldest_first(
    adapter: QueueAdapter,
) -> None:
    first, second, third, other = letter(1), letter(2), letter(3), letter(9, handler="x")
    await adapter.dead_letters.put("app", [first, second])
    await adapter.dead_letters.put("other-app", [other])
    await adapter.dead_letters.put("app", [third])
    assert await adapter.dead_letters.read("app") == [first, second, third]
    assert await adapter.dead_letters.read("other-app") == [other]
    assert await adapter.dead_letters.read("app", limit=2) == [first, second]


async def test_a_letter_of_an_error_whose_text_is_not_utf8_is_stored_whole(
    adapter: QueueAdapter,
) -> None:
    # A lone surrogate (a path decoded with surrogateescape) made every store refuse
    # every form of the letter: its message waited unacknowledged, retried for good.
    error = ValueError("no such file: /data/caf\udce9.csv")
    stored = DeadLetter.of(letter(1).message, "orders.handle", error, 3)
    assert stored.error == "no such file: /data/caf\\udce9.csv"
    await adapter.dead_letters.put("app", [stored])
    assert await adapter.dead_letters.read("app") == [stored]


async def test_a_group_without_dead_letters_reads_none(adapter: QueueAdapter) -> None:
    assert await adapter.dead_letters.read("app") == []
    await adapter.dead_letters.put("other-app", [letter(1)])
    assert await adapter.dead_letters.read("app") == []


async def test_a_dead_letter_keeps_every_field_of_its_message(adapter: QueueAdapter) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = Message("m-bin", StreamId("blobs", "b"), bytes(range(256)),
                      headers={"traceparent": trace},
                      content_type=CONTENT_MSGPACK, attempt=1, enqueued_at_ms=now_ms(),
                      token=SequenceToken(1, 41, 2))
    stored = DeadLetter(message, "blobs.handle", "DecodeError", "not msgpack", 1, now_ms())
    await adapter.dead_letters.put("app", [stored])
    assert await adapter.dead_letters.read("app") == [stored]


# -- the operator's side: ids, find, count, delete, replay (conveyor dlq) -----------------


async def test_letters_are_listed_under_stable_ids_found_counted_and_paged(
    adapter: QueueAdapter,
) -> None:
    stored = [letter(1), letter(2), letter(3)]
    await adapter.dead_letters.put("app", stored[:2])
    await adapter.dead_letters.put("other-app", [letter(9)])
    await adapter.dead_letters.put("app", stored[2:])
    listed = await adapter.dead_letters.page("app")
    assert [s.letter for s in listed] == stored
    ids = [s.id for s in listed]
    assert len(set(ids)) == 3
    assert [s.id for s in await adapter.dead_letters.page("app")] == ids  # stable
    assert await adapter.dead_letters.count("app") == 3
    assert await adapter.dead_letters.count("other-app") == 1
    assert await adapter.dead_letters.count("no-such-app") == 0
    for one in listed:
        assert await adapter.dead_letters.find("app", one.id) == one
        # Ids are per app: on Redis another app's letter may have the same one.
        assert await adapter.dead_letters.find("other-app", one.id) != one
    assert await adapter.dead_letters.page("app", 1) == listed[:1]
    assert await adapter.dead_letters.page("app", after=ids[0]) == listed[1:]
    assert await adapter.dead_letters.page("app", 1, after=ids[1]) == listed[2:]
    assert await adapter.dead_letters.page("app", after=ids[2]) == []


async def test_deleted_letters_are_gone_and_ids_not_stored_are_skipped(
    adapter: QueueAdapter,
) -> None:
    await adapter.dead_letters.put("app", [letter(1), letter(2), letter(3)])
    await adapter.dead_letters.put("other-app", [letter(9)])
    first, second, third = await adapter.dead_letters.page("app")
    assert await adapter.dead_letters.delete("app", [first.id, third.id]) == 2
    assert await adapter.dead_letters.page("app") == [second]
    assert await adapter.dead_letters.count("app") == 1
    assert await adapter.dead_letters.find("app", first.id) is None
    assert await adapter.dead_letters.delete("app", [first.id]) == 0  # already gone
    assert await adapter.dead_letters.read("app") == [second.letter]
    assert await adapter.dead_letters.count("other-app") == 1


async def test_a_malformed_letter_id_is_refused_with_the_expected_form(
    adapter: QueueAdapter,
) -> None:
    with pytest.raises(InvalidArgumentError, match="not a dead-letter id"):
        await adapter.dead_letters.find("app", "not an id")
    with pytest.raises(InvalidArgumentError, match="not a dead-letter id"):
        await adapter.dead_letters.delete("app", ["x"])
    with pytest.raises(InvalidArgumentError, match="not a dead-letter id"):
        adapter.dead_letters.check_id("not an id")  # asking no server
    await adapter.dead_letters.put("app", [letter(1)])
    [stored] = await adapter.dead_letters.page("app")
    adapter.dead_letters.check_id(stored.id)  # a stored letter's id passes


async def test_a_replay_publishes_the_message_once_to_its_queue_then_removes_the_letter(
    adapter: QueueAdapter, open_receiver: Open,
) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    original = Message("m-7", StreamId("orders", "k7"), b'{"n": 7}',
                       headers={"x-tenant": "t1", "traceparent": trace},
                       content_type=CONTENT_MSGPACK, attempt=3, enqueued_at_ms=now_ms(),
                       token=SequenceToken(0, 7))
    await adapter.dead_letters.put("app", [DeadLetter.of(original, "orders.handle", "bad", 3),
                                      letter(8)])
    seven, eight = await adapter.dead_letters.page("app")
    mapper = HashRingQueueMapper(QUEUES)
    report = await dlq.replay(adapter, mapper, "app", [seven])
    assert report.skipped == [] and report.gone == []
    [(replayed_id, token)] = report.replayed
    queue = mapper.queue_for(original.stream)
    assert replayed_id == seven.id and token.queue == queue
    # Replaying the same letter again (a second operator, a re-run) publishes nothing.
    assert (await dlq.replay(adapter, mapper, "app", [seven])).gone == [seven.id]
    [got] = await take_rest(await open_receiver(queue, "app"), 1)
    assert (got.id, got.stream, got.body, got.content_type, got.attempt, got.token) == (
        original.id, original.stream, original.body, original.content_type, 0, token)
    assert got.headers == {"x-tenant": "t1", "traceparent": trace, H_REPLAY_OF: seven.id}
    assert await adapter.dead_letters.page("app") == [eight]


async def test_a_replayed_message_that_fails_again_is_a_new_letter_naming_the_first(
    adapter: QueueAdapter, open_receiver: Open,
) -> None:
    await adapter.dead_letters.put("app", [letter(1)])
    [first] = await adapter.dead_letters.page("app")
    mapper = HashRingQueueMapper(QUEUES)
    await dlq.replay(adapter, mapper, "app", [first])
    [again] = await take(await open_receiver(mapper.queue_for(first.letter.message.stream),
                                             "app"), 1)
    await adapter.dead_letters.put("app", [DeadLetter.of(again, "orders.handle", "still bad", 3)])
    [second] = await adapter.dead_letters.page("app")
    assert second.id != first.id and second.replay_of == first.id
    assert first.replay_of == ""
    assert second.letter.message.token == again.token  # its new place, not the first's


async def test_letters_that_cannot_be_replayed_are_skipped_and_kept(adapter: QueueAdapter) -> None:
    bare = letter(1).shortened("too big")
    assert bare is not None
    bare = bare.shortened("still too big")
    assert bare is not None and bare.form == "bare"
    await adapter.dead_letters.put("app", [bare])
    [stored] = await adapter.dead_letters.page("app")
    report = await dlq.replay(adapter, HashRingQueueMapper(QUEUES), "app", [stored])
    assert report.replayed == [] and [i for i, _ in report.skipped] == [stored.id]
    assert await adapter.dead_letters.count("app") == 1


async def test_a_batch_replay_skips_letters_already_gone_and_replays_the_rest_in_order(
    adapter: QueueAdapter, open_receiver: Open,
) -> None:
    await adapter.dead_letters.put("app", [letter(1), letter(2), letter(3)])
    one, two, three = await adapter.dead_letters.page("app")
    await adapter.dead_letters.delete("app", [two.id])
    replays = [Replay(s.id, 0, dlq.replay_message(s)) for s in (one, two, three)]
    first, gone, last = await adapter.dead_letters.replay("app", replays)
    assert gone is None and first is not None and last is not None and first < last
    got = await take_rest(await open_receiver(0, "app"), 2)
    assert [m.headers[H_REPLAY_OF] for m in got] == [one.id, three.id]
    assert await adapter.dead_letters.count("app") == 0


# -- --all over many pages: a page read, acted on, then the next ---------------------------


async def test_paging_goes_on_after_letters_removed_since_they_were_read_and_stops_at_until(
    adapter: QueueAdapter,
) -> None:
    await adapter.dead_letters.put("app", [letter(n) for n in range(1, 6)])
    one, two, three, four, five = await adapter.dead_letters.page("app")
    await adapter.dead_letters.delete("app", [two.id, three.id])
    # The cursor is the id of the last letter read, gone or not: nothing after it skipped.
    assert await adapter.dead_letters.page("app", after=two.id) == [four, five]
    assert await adapter.dead_letters.page("app", 1, after=three.id) == [four]
    assert await adapter.dead_letters.page("app", until=four.id) == [one, four]
    assert await adapter.dead_letters.page("app", after=one.id, until=three.id) == []
    await adapter.dead_letters.delete("app", [four.id])
    assert await adapter.dead_letters.page("app", after=one.id, until=four.id) == []


async def test_a_mark_bounds_paging_to_the_letters_stored_before_it(
    adapter: QueueAdapter,
) -> None:
    assert await adapter.dead_letters.mark("app") is None
    await adapter.dead_letters.put("app", [letter(1), letter(2)])
    await adapter.dead_letters.put("other-app", [letter(9, handler="x")])
    mark = await adapter.dead_letters.mark("app")
    assert mark is not None
    before = await adapter.dead_letters.page("app")
    await adapter.dead_letters.put("app", [letter(3)])
    assert await adapter.dead_letters.page("app", until=mark) == before
    assert len(await adapter.dead_letters.page("app")) == 3


@pytest.mark.parametrize("adapter", SERVER_ADAPTERS, indirect=True)
async def test_paging_reads_on_past_entries_that_are_no_letters(
    adapter: QueueAdapter, put_non_letters: PutNonLetters, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Entries another tool wrote where the app's letters are (or corrupt ones), more
    than a page of them before the letters: a page read only them, listed none, and
    paging stopped there — ``dlq list``, ``replay --all`` and ``purge --all`` missed
    every letter behind them. A page reads on past them; none is listed, found or
    counted as a letter, and none makes a listing fail."""
    monkeypatch.setattr(dlq, "PAGE", 4)
    await adapter.dead_letters.put("app", [letter(1)])
    await put_non_letters("app", 3 * dlq.PAGE + 1)
    await adapter.dead_letters.put("app", [letter(2), letter(3)])
    await put_non_letters("app", 2)
    await adapter.dead_letters.put("app", [letter(4)])
    await put_non_letters("app", 3)
    listed = [s async for s in dlq.letters(adapter, "app")]
    assert [s.letter.error for s in listed] == [f"bad order {n}" for n in (1, 2, 3, 4)]
    behind = await adapter.dead_letters.page("app", 2, after=listed[0].id)
    assert behind and behind == listed[1:3][: len(behind)]  # not [] while letters follow
    assert await adapter.dead_letters.page("app", 2, after=listed[-1].id) == []
    assert [await adapter.dead_letters.find("app", s.id) for s in listed] == listed
    report = await dlq.replay(adapter, HashRingQueueMapper(QUEUES), "app",
                              dlq.stored_now(adapter, "app", limit=3), batch=2)
    assert [i for i, _ in report.replayed] == [s.id for s in listed[:3]]
    purged = await dlq.purge(adapter, "app", dlq.stored_now(adapter, "app"))
    assert (purged.matched, purged.purged) == (1, 1)
    assert [s async for s in dlq.letters(adapter, "app")] == []
    said = [r.getMessage() for r in caplog.records if "no dead letter" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(("redis: ", "kafka: ")), said  # once


def numbered_letters(count: int) -> list[DeadLetter]:
    """``count`` letters, every third of handler ``orders.audit`` (the rest
    ``orders.handle``)."""
    return [letter(n, handler="orders.audit" if n % 3 == 0 else "orders.handle")
            for n in range(count)]


async def test_replay_all_and_purge_all_take_every_letter_across_many_pages(
    adapter: QueueAdapter, open_receiver: Open, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dlq, "PAGE", 4)
    await adapter.dead_letters.put("app", numbered_letters(23))
    await adapter.dead_letters.put("other-app", [letter(99)])
    stored = await adapter.dead_letters.page("app", 100)
    audit = [s for s in stored if s.letter.handler == "orders.audit"]
    handle = [s for s in stored if s.letter.handler == "orders.handle"]
    assert (len(audit), len(handle)) == (8, 15)
    mapper = HashRingQueueMapper(QUEUES)

    report = await dlq.replay(adapter, mapper, "app", dlq.stored_now(
        adapter, "app", dlq.LetterFilter(handler="orders.handle"), limit=13), batch=3)
    assert [i for i, _ in report.replayed] == [s.id for s in handle[:13]]  # oldest first
    assert report.skipped == [] and report.gone == []
    got: list[Message] = []
    for q in range(QUEUES):
        got += await take_rest(await open_receiver(q, "app"), sum(
            1 for s in handle[:13] if mapper.queue_for(s.letter.message.stream) == q))
    assert sorted(m.headers[H_REPLAY_OF] for m in got) == sorted(s.id for s in handle[:13])
    assert sorted(m.id for m in got) == sorted(s.letter.message.id for s in handle[:13])

    purged = await dlq.purge(adapter, "app", dlq.stored_now(
        adapter, "app", dlq.LetterFilter(handler="orders.audit")))
    assert (purged.matched, purged.purged) == (8, 8)
    assert await adapter.dead_letters.page("app", 100) == handle[13:]
    assert await adapter.dead_letters.count("other-app") == 1


class RecordedLetters(DeadLetters):
    """An adapter's own dead-letter store, noting its page, replay and delete calls as
    (call, letters); with ``fail_again``, each replayed message is dead-lettered again
    right after its replay (as a handler still failing would), up to 20 times."""

    def __init__(self, store: DeadLetters, *, fail_again: bool = False) -> None:
        self.store = store
        self.calls: list[tuple[str, int]] = []
        self.asked: list[int] = []
        """The ``limit`` of each page call."""
        self.fail_again = fail_again
        self.failed_again: list[str] = []
        """The letter ids whose replayed message was dead-lettered again."""

    def __getattr__(self, name: str) -> Any:  # close() on Kafka
        return getattr(self.store, name)

    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        return await self.store.put(group, letters)

    async def page(self, group: str, limit: int = 100, *, after: str | None = None,
                   until: str | None = None) -> list[StoredLetter]:
        found = await self.store.page(group, limit, after=after, until=until)
        self.calls.append(("page", len(found)))
        self.asked.append(limit)
        return found

    async def mark(self, group: str) -> str | None:
        return await self.store.mark(group)

    def check_id(self, letter_id: str) -> None:
        self.store.check_id(letter_id)

    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        return await self.store.find(group, letter_id)

    async def count(self, group: str) -> int:
        return await self.store.count(group)

    async def delete(self, group: str, ids: Sequence[str]) -> int:
        self.calls.append(("delete", len(ids)))
        return await self.store.delete(group, ids)

    async def replay(self, group: str, replays: Sequence[Replay]
                     ) -> list[SequenceToken | None]:
        self.calls.append(("replay", len(replays)))
        tokens = await self.store.replay(group, replays)
        if self.fail_again and len(self.failed_again) < 20:
            self.failed_again += [r.letter_id for r in replays]
            await self.store.put(group, [DeadLetter.of(r.message, "orders.handle", "again", 3)
                                         for r in replays])
        return tokens


@pytest.fixture
def recorded(adapter: QueueAdapter) -> Any:
    """``recorded(fail_again=False)``: the adapter's dead letters, wrapped in
    :class:`RecordedLetters` for the test (unwrapped after it)."""
    store = adapter.dead_letters

    def wrap(*, fail_again: bool = False) -> RecordedLetters:
        wrapped = RecordedLetters(store, fail_again=fail_again)
        adapter.dead_letters = wrapped
        return wrapped

    yield wrap
    adapter.dead_letters = store


async def test_replay_all_and_purge_all_act_on_each_page_before_reading_the_next(
    adapter: QueueAdapter, recorded: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What bounds their memory: a page read, then replayed (in batches) or purged, then
    the next page — never every letter first (a million letters of 10 KB were 10 GB)."""
    monkeypatch.setattr(dlq, "PAGE", 3)
    await adapter.dead_letters.put("app", [letter(n) for n in range(7)])
    await adapter.dead_letters.put("other", [letter(n) for n in range(7)])
    store: RecordedLetters = recorded()
    report = await dlq.replay(adapter, HashRingQueueMapper(QUEUES), "app",
                              dlq.stored_now(adapter, "app"), batch=2)
    assert len(report.replayed) == 7
    assert store.calls == [("page", 3), ("replay", 2), ("page", 3), ("replay", 2),
                           ("replay", 2), ("page", 1), ("page", 0), ("replay", 1)]
    store.calls.clear()
    purged = await dlq.purge(adapter, "other", dlq.stored_now(adapter, "other"))
    assert (purged.matched, purged.purged) == (7, 7)
    assert store.calls == [("page", 3), ("delete", 3), ("page", 3), ("delete", 3),
                           ("page", 1), ("page", 0), ("delete", 1)]
    assert await adapter.dead_letters.count("app") == 0
    assert await adapter.dead_letters.count("other") == 0


async def test_letters_stored_during_a_replay_all_are_left_for_the_next_run(
    adapter: QueueAdapter, recorded: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replayed message that fails again is a new letter, stored after those the run
    started with: paging would reach it, but the run stops at the letters stored when it
    started (``DeadLetters.mark``) and replays each once."""
    monkeypatch.setattr(dlq, "PAGE", 2)
    await adapter.dead_letters.put("app", [letter(n) for n in range(5)])
    first = [s.id for s in await adapter.dead_letters.page("app")]
    store: RecordedLetters = recorded(fail_again=True)
    report = await dlq.replay(adapter, HashRingQueueMapper(QUEUES), "app",
                              dlq.stored_now(adapter, "app"), batch=2)
    assert [i for i, _ in report.replayed] == first
    assert store.failed_again == first
    again = await adapter.dead_letters.page("app")
    assert [s.replay_of for s in again] == first  # each failed again once, kept


def sized(n: int, body_bytes: int) -> DeadLetter:
    message = Message(f"m{n}", StreamId("orders", f"k{n}"), b"x" * body_bytes,
                      enqueued_at_ms=now_ms(), token=SequenceToken(0, n))
    return DeadLetter(message, "orders.handle", "ValueError", f"bad order {n}", 3, now_ms())


async def test_a_page_asks_for_as_many_letters_as_the_byte_budget_holds_of_the_last(
    adapter: QueueAdapter, recorded: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--all`` held a page of 500 letters whatever their size (500 MB of 1 MB
    bodies): each page after the first asks for as many letters as ``PAGE_BYTES`` holds
    of the largest of the page before — fewer for big letters, never fewer than 1, back
    up to ``PAGE`` for small ones."""
    monkeypatch.setattr(dlq, "PAGE_BYTES", 50_000)
    monkeypatch.setattr(dlq, "FIRST_PAGE", 4)
    big, huge, small = 20_000, 60_000, 10
    await adapter.dead_letters.put("app", [sized(n, big) for n in range(8)])
    await adapter.dead_letters.put("app", [sized(8, huge)])
    await adapter.dead_letters.put("app", [sized(n, small) for n in range(9, 15)])
    store: RecordedLetters = recorded()
    listed = [s async for s in dlq.letters(adapter, "app")]
    assert [len(s.letter.message.body) for s in listed] == [big] * 8 + [huge] + [small] * 6
    assert [s.letter.error for s in listed] == [f"bad order {n}" for n in range(15)]
    fits_small = min(dlq.PAGE, dlq.PAGE_BYTES // dlq.letter_bytes(listed[-1]))
    # 4 big; 2 a page (2 big, 2 big, the huge and a small one); 1 (a small one); the rest.
    assert store.asked == [4, 2, 2, 2, 1, fits_small, fits_small]
    assert [n for call, n in store.calls] == [4, 2, 2, 2, 1, 4, 0]
    assert 1 < fits_small <= dlq.PAGE
    purged = await dlq.purge(adapter, "app", dlq.stored_now(adapter, "app"))
    assert (purged.matched, purged.purged) == (15, 15)
