"""Dead letters on Redis (the adapter's ``dead_letters`` facet): ``PREFIX:dlq:APP`` is
one stream per app.

Storing runs :data:`~conveyor.adapters.redis.scripts.DEAD_LETTER` (see
:meth:`RedisDeadLetters.put`). A letter's id is its entry id in that stream. Listing is
``XRANGE`` (reading on past entries that are no letters: another tool's, or corrupt),
counting ``XLEN`` (which counts those too), purging ``XDEL``. Replaying runs
:data:`~conveyor.adapters.redis.scripts.REPLAY_LETTER`: one script appends the message
to its queue's stream and deletes the letter, atomically, so a replay killed at any
point has done both or neither. The queue's key comes from the same
:class:`~conveyor.adapters.redis.keys.Keys` as every publish (``PREFIX:q:N``), N from
the caller's mapper.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis.exceptions as rex

from conveyor.adapters.redis import scripts as lua
from conveyor.adapters.redis.codec import encode_fields, letter_entry, stored_letters
from conveyor.adapters.redis.errors import Caller, wrong_type, wrong_type_line
from conveyor.adapters.redis.keys import Keys, token_of
from conveyor.platform.adapter import DeadLetters
from conveyor.platform.errors import BrokerError, InvalidArgumentError, StoreUnfitError
from conveyor.platform.ids import POSITION_MAX, SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import DeadLetter
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

Entries = list[Any]
"""``XRANGE``'s reply as hiredis parsed it: ``[[id, [field, value, ...]], ...]``."""

Fields = dict[bytes | str, bytes | str]

T = TypeVar("T")

_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")

LETTERS_EFFECT = ("the app's dead letters cannot be stored (the messages wait "
                  "unacknowledged) and dlq commands find none; rename or delete the key")
"""What a key of another type where an app's dead letters belong costs, and the fix."""

REPLAY_MARK_S = 7 * 24 * 3600
"""Cluster mode: how long a replayed letter's marker lives — the time within which a
replay killed between its two writes can be run again without doubling that letter."""


def check_id(letter_id: str) -> str:
    if not _ENTRY_ID.fullmatch(letter_id) or any(
        int(part) > POSITION_MAX for part in letter_id.split("-")
    ):
        raise InvalidArgumentError(
            f"not a dead-letter id on redis: {letter_id!r} (expected a stream entry id, "
            f"e.g. 1700000000000-0, each part at most {POSITION_MAX})"
        )
    return letter_id


class RedisDeadLetters(DeadLetters):
    """Every app's dead letters on one Redis prefix: the adapter's connection, caller
    (retries, error translation) and keys, and the scripts of its own."""

    def __init__(self, redis: Any, caller: Caller, keys: Keys, *, cluster: bool,
                 max_entries: int, publish_window_ms: int) -> None:
        self._redis = redis
        self._caller = caller
        self._keys = keys
        self._cluster = cluster
        self._max_entries = max_entries
        """``[dead_letters] max_entries``: 0 keeps every letter."""
        self._publish_window_ms = publish_window_ms
        self._put_script = redis.register_script(lua.DEAD_LETTER)
        self._replay_script = redis.register_script(lua.REPLAY_LETTER)
        self._replay_marked_script = redis.register_script(lua.REPLAY_MARKED)
        self._skipped_log = ThrottledLog(log, interval_s=3600.0)

    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """One entry per letter on ``PREFIX:dlq:APP`` (see conveyor.platform.letters), by
        :data:`~conveyor.adapters.redis.scripts.DEAD_LETTER`: under a batch id, so a call
        retried after its reply was lost stores nothing twice (as a publish). With
        ``[dead_letters] max_entries``, an exact ``XTRIM MAXLEN`` in the same script,
        whose count of evicted letters is returned. A key of another type there raises
        :class:`StoreUnfitError` naming it (no letter can be stored until it is fixed)."""
        args: list[Any] = [self._publish_window_ms, self._max_entries]
        for letter in letters:
            flat = letter_entry(letter, group)
            args += [len(flat), *flat]
        keys = [self._keys.dead_letters(group), self._keys.letters_stored(group, uuid.uuid4().hex)]
        try:
            evicted = await self._caller.retrying(
                f"storing dead letters of {group!r}",
                lambda: self._put_script(keys=keys, args=args))
        except BrokerError as exc:
            if wrong_type(exc.__cause__):
                raise StoreUnfitError(await self._unfit(group, exc)) from exc
            raise
        return int(evicted)

    async def _unfit(self, group: str, exc: BrokerError) -> str:
        """What is wrong with where ``group``'s letters go, after a ``WRONGTYPE``."""
        key = self._keys.dead_letters(group)
        found = await self._caller.retrying(
            f"reading the type of {key}", lambda: self._redis.type(key))
        kind = found.decode() if isinstance(found, bytes) else str(found)
        if kind in ("stream", "none"):  # (changed since) or another key of the script
            return f"{exc}; rename or delete the key of another type"
        return wrong_type_line(key, f"app {group!r}'s dead letters", kind, "stream",
                               LETTERS_EFFECT)

    async def page(self, group: str, limit: int = 100, *, after: str | None = None,
                   until: str | None = None) -> list[StoredLetter]:
        """``XRANGE … COUNT limit`` from just after ``after``: a range by id, whether or
        not ``after`` is still stored.

        Entries that are no letters (:func:`~conveyor.adapters.redis.codec.stored_letters`)
        are skipped, and said once per app and adapter (:meth:`_say_skipped`); while a
        range held nothing else, the next ``limit`` entries are read, until one is a letter
        or the range ends: an empty page is the end, however many such entries come
        first. So a call holds ``limit`` entries at most, and may list fewer letters."""
        key = self._keys.dead_letters(group)
        start = "-" if after is None else f"({check_id(after)}"
        end = "+" if until is None else check_id(until)
        if limit <= 0:
            return []

        async def xrange(start: str) -> Entries:
            entries: Entries = await self._stream_read(
                self._redis.xrange(key, start, end, count=limit), [])
            return entries

        skipped: list[str] = []
        while True:
            entries = await self._caller.retrying("reading dead letters",
                                                  functools.partial(xrange, start))
            found = stored_letters(entries, skipped)
            if found or len(entries) < limit:
                break
            start = f"({skipped[-1]}"  # every entry read was skipped
        self._say_skipped(group, skipped)
        return found

    async def mark(self, group: str) -> str | None:
        """The newest entry's id (``XREVRANGE … COUNT 1``): every later ``XADD *`` is
        above it."""
        key = self._keys.dead_letters(group)
        entries: Entries = await self._caller.retrying(
            "reading the newest dead letter", lambda: self._stream_read(
                self._redis.xrevrange(key, "+", "-", count=1), []))
        if not entries:
            return None
        entry_id = entries[0][0]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def check_id(self, letter_id: str) -> None:
        check_id(letter_id)

    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        """None too for an entry that is no letter (said, as :meth:`page` says it)."""
        skipped: list[str] = []
        found = stored_letters(await self._entry(group, letter_id), skipped)
        self._say_skipped(group, skipped)
        return found[0] if found else None

    def _say_skipped(self, group: str, skipped: list[str]) -> None:
        """A warning for entries of ``group``'s stream that are no letters: once per app
        and adapter (a command's run; the console's request), naming the first."""
        if skipped:
            key = self._keys.dead_letters(group)
            self._skipped_log.log(
                logging.WARNING, group,
                "redis: entries of %s are no dead letters (written by another tool, or "
                "corrupt; %d in the range read, the first %s): dlq commands skip them, its "
                "count of letters includes them; see one with `redis-cli XRANGE %s %s %s`, "
                "remove them with XDEL", key, len(skipped), skipped[0], key, skipped[0],
                skipped[0])

    async def _entry(self, group: str, letter_id: str) -> Entries:
        key = self._keys.dead_letters(group)
        check_id(letter_id)
        entries: Entries = await self._caller.retrying(
            "reading a dead letter", lambda: self._stream_read(
                self._redis.xrange(key, letter_id, letter_id), []))
        return entries

    async def count(self, group: str) -> int:
        key = self._keys.dead_letters(group)
        count: int = await self._caller.retrying(
            "counting dead letters", lambda: self._stream_read(self._redis.xlen(key), 0))
        return count

    @staticmethod
    async def _stream_read(call: Awaitable[T], empty: T) -> T:
        """``call``'s reply, or ``empty`` where the app's key is of another type (no
        letter can be stored there: the adapter's ``store_problems`` names it)."""
        try:
            return await call
        except rex.ResponseError as exc:
            if wrong_type(exc):
                return empty
            raise

    async def delete(self, group: str, ids: Sequence[str]) -> int:
        key = self._keys.dead_letters(group)
        checked = [check_id(i) for i in ids]
        deleted = 0
        for i in range(0, len(checked), 1000):
            chunk = checked[i : i + 1000]

            async def xdel(chunk: list[str] = chunk) -> int:
                return int(await self._redis.xdel(key, *chunk))

            deleted += await self._caller.retrying("deleting dead letters", xdel)
        return deleted

    async def replay(self, group: str, replays: Sequence[Replay]) -> list[SequenceToken | None]:
        """Each letter by one script (XADD to the queue, XDEL of the letter), atomically
        (see the module docstring), the message's fields as every publish writes them; a
        batch's scripts go in one pipeline.

        Retried on connection loss: a script that ran before the reply was lost finds its
        letter gone on the retry and reports None — the message was published once.
        """
        fields = [(r.letter_id, r.queue, encode_fields(r.message)) for r in replays]
        if self._cluster:
            return [await self._replay_apart(group, *f) for f in fields]
        dlq_key = self._keys.dead_letters(group)
        calls = [
            ([dlq_key, self._keys.queue(queue)],
             [check_id(letter_id), *(x for pair in flat.items() for x in pair)])
            for letter_id, queue, flat in fields
        ]

        async def send() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    await self._replay_script(keys=keys, args=args, client=pipe)
                results: list[Any] = await pipe.execute()
            return results

        new_ids = await self._caller.retrying(f"replaying {len(calls)} dead letter(s)", send)
        return [None if new_id is None else token_of(new_id, r.queue)
                for new_id, r in zip(new_ids, replays, strict=True)]

    async def _replay_apart(self, group: str, letter_id: str, queue: int,
                            fields: Fields) -> SequenceToken | None:
        """One letter on a cluster, in three steps: is the letter there; append it to its
        queue unless its marker says it was (:data:`~conveyor.adapters.redis.scripts.
        REPLAY_MARKED`, in the queue's slot); delete the letter. Killed after the append, a
        re-run finds the marker and only deletes; two replays racing append once."""
        check_id(letter_id)
        if not await self._entry(group, letter_id):
            return None
        keys = [self._keys.queue(queue), self._keys.replayed(group, queue, letter_id)]
        args = [REPLAY_MARK_S * 1000, *(x for pair in fields.items() for x in pair)]
        new_id = await self._caller.retrying(
            f"replaying dead letter {letter_id}",
            lambda: self._replay_marked_script(keys=keys, args=args))
        await self.delete(group, [letter_id])
        return token_of(new_id, queue)
