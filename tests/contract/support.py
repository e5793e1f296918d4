"""What the contract tests share: messages numbered by their body, and taking exactly
as many as expected (with a deadline) from a receiver."""

from __future__ import annotations

import time

from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message, now_ms

QUIET_S = 0.3
"""How long a receiver must stay empty to count as having nothing more."""


def numbered(numbers: range | list[int], key: str = "k", *, stamp: bool = False) -> list[Message]:
    """Messages of stream ``contract/key`` whose bodies are their numbers.

    ``stamp`` sets ``enqueued_at_ms`` to now (what a time rewind looks at).
    """
    at = now_ms() if stamp else 0
    return [Message(f"{key}-{n}", StreamId("contract", key), str(n).encode(), enqueued_at_ms=at)
            for n in numbers]


def numbers(messages: list[Message]) -> list[int]:
    return [int(m.body) for m in messages]


def tokens(messages: list[Message]) -> list[SequenceToken]:
    found = [m.token for m in messages]
    assert None not in found, "a delivered message has no token"
    return [t for t in found if t is not None]


async def take(receiver: QueueReceiver, count: int, timeout_s: float = 15.0) -> list[Message]:
    """Exactly ``count`` messages, waiting at most ``timeout_s`` for them all."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s with {numbers(got)} "
                                 f"({len(got)} of {count} messages)")
        got += await receiver.get_messages(count - len(got), timeout_s=0.5)
    return got


async def take_rest(receiver: QueueReceiver, count: int) -> list[Message]:
    """Exactly ``count`` messages, and then nothing more for :data:`QUIET_S`."""
    got = await take(receiver, count)
    more = await receiver.get_messages(100, timeout_s=QUIET_S)
    assert more == [], f"expected nothing after {numbers(got)}, got {numbers(more)}"
    return got


async def take_and_ack(receiver: QueueReceiver, count: int) -> list[Message]:
    got = await take(receiver, count)
    await receiver.acknowledge(tokens(got))
    return got
