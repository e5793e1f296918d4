"""Stream ids interned by the receivers that decode them from wire bytes."""

from __future__ import annotations

from conveyor.platform.ids import StreamId

INTERN_MAX = 4096
"""Distinct streams a receiver remembers (then it starts again)."""


class StreamIds(dict[tuple[bytes, bytes], StreamId]):
    """``ids[ns, key]``: the :class:`StreamId` of a namespace and key as the wire has them
    (bytes), decoded once. A batch of one stream's messages then shares one id, which the
    cache's lane look-ups compare by identity. Decoding raises on bytes that are not
    UTF-8 (the caller isolates that entry)."""

    __slots__ = ()

    def __missing__(self, wire: tuple[bytes, bytes]) -> StreamId:
        if len(self) >= INTERN_MAX:
            self.clear()
        ns, key = wire
        sid = self[wire] = StreamId(ns.decode(), key.decode())
        return sid
