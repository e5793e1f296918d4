"""Value objects that name things: streams and positions in a queue."""

from __future__ import annotations

import re

import msgspec

from conveyor.platform.errors import InvalidArgumentError

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
"""Names that reach into a broker's key space (app names, which are consumer groups, and
Redis key prefixes): 1-128 ASCII letters, digits, ``_``, ``.``, ``-``. Check with
``NAME.fullmatch``: ``match`` against ``...$`` would accept a trailing newline."""


class StreamId(msgspec.Struct, frozen=True, array_like=True):
    """A stream: every message of one stream is delivered in order.

    ``namespace`` selects the handlers (``@app.handler("orders")``); ``key`` names the
    stream inside it (an order id, a tenant id, ...).
    """

    namespace: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.key}"


class SequenceToken(msgspec.Struct, frozen=True, order=True, array_like=True):
    """A position inside one queue, comparable within that queue.

    Backends map their native positions onto ``(major, minor)``: a Kafka offset or a
    memory-log offset is ``(offset, 0)``; a Redis stream id ``1700000000000-3`` is
    ``(1700000000000, 3)``. Its text form ``queue:major-minor`` is what
    ``conveyor rewind --to`` accepts.
    """

    queue: int
    major: int
    minor: int = 0

    def __str__(self) -> str:
        return f"{self.queue}:{self.major}-{self.minor}"

    @classmethod
    def parse(cls, text: str) -> SequenceToken:
        """Parse ``queue:major[-minor]``; raises :class:`InvalidArgumentError` (a ``ValueError``)
        with the expected form."""
        try:
            queue_s, pos = text.split(":", 1)
            major_s, _, minor_s = pos.partition("-")
            return cls(int(queue_s), int(major_s), int(minor_s or 0))
        except ValueError:
            raise InvalidArgumentError(
                f"not a sequence token: {text!r} (expected QUEUE:MAJOR[-MINOR], e.g. 3:1042-0)"
            ) from None
