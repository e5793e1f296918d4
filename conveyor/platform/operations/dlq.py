"""Dead letters for operators: pick them by filter, replay them, purge them.

What ``conveyor dlq`` calls; the storing side is :mod:`conveyor.platform.delivery.dead_letter`
and the layout :mod:`conveyor.platform.letters`.

Replaying a letter re-publishes its message as it was published — body, stream, content
type, user headers, trace context (``traceparent`` / ``tracestate`` travel as headers),
``cv-id`` — with a fresh ``cv-ts``, no ``cv-attempt``, and the header ``cv-replay-of`` set
to the letter's id. It goes to the queue the same :class:`HashRingQueueMapper` picks for
every publish, through the adapter's dead-letter facet
(:meth:`~conveyor.platform.adapter.DeadLetters.replay`), which removes the letter only
once the message is stored and publishes it once even when a replay is killed midway
and run again (each backend's docstring says how).
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import H_REPLAY_OF, Message, Undecodable, now_ms

PAGE = 500
"""Letters read per call at most while paging through a store (and ids per purge call)."""
PAGE_BYTES = 64 * 2**20
"""About how much a page of letters may hold. A page's count is chosen from the page
before: as many letters as this holds of its largest (:func:`letter_bytes`), at least 1,
at most :data:`PAGE` — 500 letters of 1 MB bodies were 500 MB held by ``replay --all``.
A page of letters larger than the one before may pass it; the next is smaller."""
FIRST_PAGE = 64
"""Letters the first page asks for, before any size is known: :data:`PAGE_BYTES` of
letters of 1 MB (Kafka's default record limit)."""
LETTER_OVERHEAD = 1024
"""Bytes a letter holds besides its body, texts and headers (its objects), about."""
BATCH = 100
"""Letters replayed per adapter call (``conveyor dlq replay --batch``)."""

Keep = Callable[[StoredLetter], bool]
"""Which letters to take (a :class:`LetterFilter`, the console's ``Choice.keeps``)."""
Letters = Iterable[StoredLetter] | AsyncIterable[StoredLetter]


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """Which letters a command acts on: every one, or those of a handler / error type /
    message namespace."""

    handler: str | None = None
    error_type: str | None = None
    namespace: str | None = None

    def __call__(self, stored: StoredLetter) -> bool:
        letter = stored.letter
        return ((self.handler is None or letter.handler == self.handler)
                and (self.error_type is None or letter.error_type == self.error_type)
                and (self.namespace is None
                     or letter.message.stream.namespace == self.namespace))


async def letters(adapter: QueueAdapter, group: str, chosen: Keep = LetterFilter(),
                  limit: int | None = None, *,
                  until: str | None = None) -> AsyncIterator[StoredLetter]:
    """``group``'s letters that ``chosen`` keeps, oldest first, at most ``limit``, up to
    the letter ``until`` (see ``DeadLetters.mark``), read a page at a time: one page held
    at once, of :data:`FIRST_PAGE` letters, then as many as :data:`PAGE_BYTES` holds of
    the page before's largest (:func:`next_page`).

    The caller may remove letters between two of them (a replay, a purge): the next page
    starts after the last letter read, whether or not it is still stored. Paging ends at
    an empty page, not a short one: a store may list fewer than asked with more to come
    (it reads on past entries that are no letters, see ``DeadLetters.page``)."""
    after: str | None = None
    found = 0
    count = min(PAGE, FIRST_PAGE)
    while limit is None or found < limit:
        page = await adapter.dead_letters.page(group, count, after=after, until=until)
        if not page:
            return
        for stored in page:
            if chosen(stored):
                yield stored
                found += 1
                if limit is not None and found >= limit:
                    return
        after, count = page[-1].id, next_page(page)


def next_page(page: list[StoredLetter]) -> int:
    """How many letters to ask for after ``page``: as many as :data:`PAGE_BYTES` holds of
    its largest letter, at least 1, at most :data:`PAGE`."""
    largest = max(letter_bytes(stored) for stored in page)
    return max(1, min(PAGE, PAGE_BYTES // largest))


def letter_bytes(stored: StoredLetter) -> int:
    """About how many bytes ``stored`` holds: its body, texts, headers and (an
    undecodable message's) raw fields, plus :data:`LETTER_OVERHEAD`."""
    letter = stored.letter
    msg = letter.message
    size = (LETTER_OVERHEAD + len(msg.body) + len(letter.error) + len(msg.stream.key)
            + sum(len(name) + len(value) for name, value in msg.headers.items()))
    if isinstance(msg, Undecodable):
        size += sum(len(name) + len(value or b"") for name, value in msg.raw_fields)
    return size


async def stored_now(adapter: QueueAdapter, group: str, chosen: Keep = LetterFilter(),
                     limit: int | None = None) -> AsyncIterator[StoredLetter]:
    """:func:`letters` among those stored when it starts (``--all``): a letter stored
    meanwhile — a replayed message that failed again — is left to the next run, not
    replayed again in this one."""
    until = await adapter.dead_letters.mark(group)
    if until is None:
        return
    async for stored in letters(adapter, group, chosen, limit, until=until):
        yield stored


async def each(chosen: Letters) -> AsyncIterator[StoredLetter]:
    """The letters of ``chosen``, a list or a page-at-a-time :func:`letters` alike."""
    if isinstance(chosen, AsyncIterable):
        async for stored in chosen:
            yield stored
    else:
        for stored in chosen:
            yield stored


def letter_json(stored: StoredLetter, *, body: bool = False) -> dict[str, Any]:
    """One letter as plain JSON values: what ``conveyor dlq list --json`` prints and the
    console serves (``body`` too, as text or else base64, for ``dlq show``)."""
    letter = stored.letter
    msg = letter.message
    out: dict[str, Any] = {
        "id": stored.id, "namespace": msg.stream.namespace, "key": msg.stream.key,
        "handler": letter.handler, "error_type": letter.error_type, "error": letter.error,
        "attempts": letter.attempts, "failed_at_ms": letter.failed_at_ms,
        "failed_at": datetime.fromtimestamp(letter.failed_at_ms / 1000, UTC).strftime(
            "%Y-%m-%d %H:%M:%S"),
        "message_id": msg.id, "content_type": msg.content_type, "headers": msg.headers,
        "form": letter.form, "token": str(msg.token) if msg.token is not None else None,
        "replay_of": stored.replay_of or None,
    }
    if isinstance(msg, Undecodable) and letter.form == "full":
        # What the entry held, since no field could be read. A shorter form kept none
        # of them: what a store reads back there are its placeholders, never the entry's.
        out["raw_fields"] = [[_text(name), None if value is None else _text(value)]
                             for name, value in msg.raw_fields]
        if msg.raw_key is not None:
            out["raw_key"] = _text(msg.raw_key)
    if body:
        try:
            out["body"] = msg.body.decode()
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(msg.body).decode()
    return out


def _text(data: bytes) -> str:
    """Bytes of an undecodable entry as text: UTF-8, other bytes as ``\\xNN``."""
    return data.decode("utf-8", "backslashreplace")


def not_replayable(stored: StoredLetter) -> str | None:
    """Why a letter cannot be replayed, or None if it can."""
    letter = stored.letter
    if isinstance(letter.message, Undecodable) or not letter.message.stream.namespace:
        return "its message was undecodable (no namespace to route it by)"
    if letter.form == "bare":
        return "only its id was stored (bare form): its body is gone"
    return None


def replay_message(stored: StoredLetter) -> Message:
    """The message a replay publishes (see the module docstring)."""
    msg = stored.letter.message
    return Message(
        id=msg.id,
        stream=msg.stream,
        body=msg.body,
        headers={**msg.headers, H_REPLAY_OF: stored.id},
        content_type=msg.content_type,
        enqueued_at_ms=now_ms(),
    )


@dataclass
class ReplayReport:
    replayed: list[tuple[str, SequenceToken]] = field(default_factory=list)
    """(letter id, where its message went), in replay order."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(letter id, why): letters that cannot be replayed; they stay stored."""
    gone: list[str] = field(default_factory=list)
    """Letters removed meanwhile (replayed or purged by someone else): nothing published."""


async def replay(adapter: QueueAdapter, mapper: HashRingQueueMapper, group: str,
                 chosen: Letters,
                 on_replayed: Callable[[str, SequenceToken], None] | None = None,
                 batch: int = BATCH) -> ReplayReport:
    """Replay the letters of ``chosen``, in order, ``batch`` letters per adapter call.

    An async ``chosen`` (:func:`stored_now`) is read as the replay goes: a batch is
    replayed before the next page is read, so a page and a batch of letters are held,
    however many there are (the report keeps their ids)."""
    report = ReplayReport()
    pending: list[Replay] = []

    async def flush() -> None:
        tokens = await adapter.dead_letters.replay(group, pending)
        for replay_, token in zip(pending, tokens, strict=True):
            if token is None:
                report.gone.append(replay_.letter_id)
                continue
            report.replayed.append((replay_.letter_id, token))
            if on_replayed is not None:
                on_replayed(replay_.letter_id, token)
        pending.clear()
        checkpoint("replayed")

    async for stored in each(chosen):
        why = not_replayable(stored)
        if why is not None:
            report.skipped.append((stored.id, why))
            continue
        message = replay_message(stored)
        pending.append(Replay(stored.id, mapper.queue_for(message.stream), message))
        if len(pending) >= batch:
            await flush()
    if pending:
        await flush()
    return report


@dataclass(frozen=True)
class PurgeReport:
    matched: int
    """Letters chosen (some may have been removed meanwhile by another run)."""
    purged: int
    """Letters removed by this purge."""


async def purge(adapter: QueueAdapter, group: str, chosen: Letters,
                batch: int | None = None,
                on_purged: Callable[[int], None] | None = None) -> PurgeReport:
    """Delete the letters of ``chosen``, ``batch`` ids (default :data:`PAGE`) per
    adapter call: an async ``chosen`` is read as the purge goes, so only a page of
    letters is held. ``on_purged(n)`` is called after each call that deleted ``n``
    (what a purge cut short had done: the console says it)."""
    batch = batch or PAGE
    ids: list[str] = []
    matched = purged = 0

    async def delete() -> int:
        deleted = await adapter.dead_letters.delete(group, ids)
        if on_purged is not None:
            on_purged(deleted)
        return deleted

    async for stored in each(chosen):
        matched += 1
        ids.append(stored.id)
        if len(ids) >= batch:
            purged += await delete()
            ids = []
    if ids:
        purged += await delete()
    return PurgeReport(matched, purged)


KILL_ENV = "CONVEYOR_TEST_DLQ_KILL_AT"
_passed: dict[str, int] = {}


def checkpoint(stage: str) -> None:
    """A point where the fault tests stop a replay the hard way.

    With ``CONVEYOR_TEST_DLQ_KILL_AT=STAGE:N`` in the environment, the process sends
    itself SIGKILL the N-th time it passes ``STAGE`` (``replayed``: after a batch's
    replay completed; ``published``: Kafka, after a batch's messages are stored and
    before its letters are recorded as replayed). Unset (always, outside tests), it does nothing.
    """
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    at_stage, _, count = wanted.partition(":")
    if at_stage != stage:
        return
    _passed[stage] = _passed.get(stage, 0) + 1
    if _passed[stage] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
