"""Dead letters: stored per group and read back oldest first.

Written against today's API (``dead_letter(group, letters)`` and
``read_dead_letters(group, limit)``); the dead-letter layout is being changed, so
every dead-letter promise of the port lives in this one file.
"""

from __future__ import annotations

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import CONTENT_MSGPACK, DeadLetter, Message, now_ms


def letter(n: int, *, handler: str = "orders.handle") -> DeadLetter:
    message = Message(f"m{n}", StreamId("orders", f"k{n}"), f'{{"n": {n}}}'.encode(),
                      headers={"x-tenant": "t1"}, attempt=3, enqueued_at_ms=now_ms(),
                      token=SequenceToken(0, n))
    return DeadLetter(message, handler, "ValueError", f"bad order {n}", 3, now_ms())


async def test_dead_letters_are_read_back_as_stored_per_group_oldest_first(
    adapter: QueueAdapter,
) -> None:
    first, second, third, other = letter(1), letter(2), letter(3), letter(9, handler="x")
    await adapter.dead_letter("app", [first, second])
    await adapter.dead_letter("other-app", [other])
    await adapter.dead_letter("app", [third])
    assert await adapter.read_dead_letters("app") == [first, second, third]
    assert await adapter.read_dead_letters("other-app") == [other]
    assert await adapter.read_dead_letters("app", limit=2) == [first, second]


async def test_a_group_without_dead_letters_reads_none(adapter: QueueAdapter) -> None:
    assert await adapter.read_dead_letters("app") == []
    await adapter.dead_letter("other-app", [letter(1)])
    assert await adapter.read_dead_letters("app") == []


async def test_a_dead_letter_keeps_every_field_of_its_message(adapter: QueueAdapter) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = Message("m-bin", StreamId("blobs", "b"), bytes(range(256)),
                      headers={"traceparent": trace},
                      content_type=CONTENT_MSGPACK, attempt=1, enqueued_at_ms=now_ms(),
                      token=SequenceToken(1, 41, 2))
    stored = DeadLetter(message, "blobs.handle", "DecodeError", "not msgpack", 1, now_ms())
    await adapter.dead_letter("app", [stored])
    assert await adapter.read_dead_letters("app") == [stored]
