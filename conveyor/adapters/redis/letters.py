"""Dead letters on Redis, for operators: ``PREFIX:dlq:APP`` is one stream per app.

A letter's id is its entry id in that stream. Listing is ``XRANGE``, counting ``XLEN``,
purging ``XDEL``. Replaying runs :data:`~conveyor.adapters.redis.scripts.REPLAY_LETTER`:
one script appends the message to its queue's stream and deletes the letter, atomically,
so a replay killed at any point has done both or neither. The queue's key comes from the
same :class:`~conveyor.adapters.redis.keys.Keys` as every publish (``PREFIX:q:N``), N from
the caller's mapper.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from conveyor.adapters.redis.errors import Caller
from conveyor.adapters.redis.keys import Keys, token_of
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import SequenceToken


class LetterHost(Protocol):
    """What the dead-letter commands use of the adapter (a protocol: they import none
    of it)."""

    redis: Any
    caller: Caller
    keys: Keys
    cluster: bool
    replay_script: Any
    replay_marked_script: Any

Entries = list[Any]
"""``XRANGE``'s reply as hiredis parsed it: ``[[id, [field, value, ...]], ...]``; the
adapter reads the letters out of it (``conveyor.adapters.redis.codec.stored_letters``)."""

_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def check_id(letter_id: str) -> str:
    if not _ENTRY_ID.fullmatch(letter_id):
        raise InvalidArgumentError(
            f"not a dead-letter id on redis: {letter_id!r} (expected a stream entry id, "
            "e.g. 1700000000000-0)"
        )
    return letter_id


async def list_letters(adapter: LetterHost, group: str, limit: int,
                       after: str | None) -> Entries:
    key = adapter.keys.dead_letters(group)
    start = "-" if after is None else f"({check_id(after)}"
    entries: Entries = await adapter.caller.retrying(
        "reading dead letters", lambda: adapter.redis.xrange(key, start, "+", count=limit)
    )
    return entries


async def find_letter(adapter: LetterHost, group: str, letter_id: str) -> Entries:
    key = adapter.keys.dead_letters(group)
    check_id(letter_id)
    entries: Entries = await adapter.caller.retrying(
        "reading a dead letter", lambda: adapter.redis.xrange(key, letter_id, letter_id)
    )
    return entries


async def count_letters(adapter: LetterHost, group: str) -> int:
    key = adapter.keys.dead_letters(group)
    count: int = await adapter.caller.retrying("counting dead letters",
                                               lambda: adapter.redis.xlen(key))
    return count


async def delete_letters(adapter: LetterHost, group: str, ids: Sequence[str]) -> int:
    key = adapter.keys.dead_letters(group)
    checked = [check_id(i) for i in ids]
    deleted = 0
    for i in range(0, len(checked), 1000):
        chunk = checked[i : i + 1000]

        async def xdel(chunk: list[str] = chunk) -> int:
            return int(await adapter.redis.xdel(key, *chunk))

        deleted += await adapter.caller.retrying("deleting dead letters", xdel)
    return deleted


Fields = dict[bytes | str, bytes | str]


REPLAY_MARK_S = 7 * 24 * 3600
"""Cluster mode: how long a replayed letter's marker lives — the time within which a
replay killed between its two writes can be run again without doubling that letter."""


async def replay_letters(adapter: LetterHost, group: str,
                         replays: Sequence[tuple[str, int, Fields]]) -> list[SequenceToken | None]:
    """Each (letter id, queue, the message's fields as every publish writes them) by one
    script, atomically (see the module docstring); a batch's scripts go in one pipeline.

    Retried on connection loss: a script that ran before the reply was lost finds its
    letter gone on the retry and reports None — the message was published once.
    """
    if adapter.cluster:
        return [await _replay_apart(adapter, group, *r) for r in replays]
    dlq_key = adapter.keys.dead_letters(group)
    calls = [
        ([dlq_key, adapter.keys.queue(queue)],
         [check_id(letter_id), *(x for pair in fields.items() for x in pair)])
        for letter_id, queue, fields in replays
    ]

    async def send() -> list[Any]:
        async with adapter.redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                await adapter.replay_script(keys=keys, args=args, client=pipe)
            results: list[Any] = await pipe.execute()
        return results

    new_ids = await adapter.caller.retrying(f"replaying {len(calls)} dead letter(s)", send)
    return [None if new_id is None else token_of(new_id, queue)
            for new_id, (_, queue, _) in zip(new_ids, replays, strict=True)]


async def _replay_apart(adapter: LetterHost, group: str, letter_id: str, queue: int,
                        fields: Fields) -> SequenceToken | None:
    """One letter on a cluster, in three steps: is the letter there; append it to its
    queue unless its marker says it was (:data:`~conveyor.adapters.redis.scripts.
    REPLAY_MARKED`, in the queue's slot); delete the letter. Killed after the append, a
    re-run finds the marker and only deletes; two replays racing append once."""
    check_id(letter_id)
    if not await find_letter(adapter, group, letter_id):
        return None
    keys = [adapter.keys.queue(queue), adapter.keys.replayed(group, queue, letter_id)]
    args = [REPLAY_MARK_S * 1000, *(x for pair in fields.items() for x in pair)]
    new_id = await adapter.caller.retrying(
        f"replaying dead letter {letter_id}",
        lambda: adapter.replay_marked_script(keys=keys, args=args))
    await delete_letters(adapter, group, [letter_id])
    return token_of(new_id, queue)
