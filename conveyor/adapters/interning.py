"""Stream ids interned by the receivers that decode them from wire bytes."""

from __future__ import annotations

from conveyor.platform.ids import KEY_MAX, NAMESPACE_MAX, StreamId

INTERN_MAX = 4096
"""Distinct streams a receiver remembers (then it starts again)."""
NAMED_MAX = 4 * (NAMESPACE_MAX + KEY_MAX)
"""The most bytes of namespace and key a remembered stream has: the UTF-8 of the longest
a client sends. Another producer's may be any length: remembered, 200 streams of 1 MB
keys held ~400 MB after their messages were handled (4,096 could hold 8 GB); such a
stream's messages each decode their own id."""


class StreamIds(dict[tuple[bytes, bytes], StreamId]):
    """``ids[ns, key]``: the :class:`StreamId` of a namespace and key as the wire has them
    (bytes), decoded once. A batch of one stream's messages then shares one id, which the
    cache's lane look-ups compare by identity. Decoding raises on bytes that are not
    UTF-8 (the caller isolates that entry)."""

    __slots__ = ()

    def __missing__(self, wire: tuple[bytes, bytes]) -> StreamId:
        ns, key = wire
        sid = StreamId(ns.decode(), key.decode())
        if len(ns) + len(key) <= NAMED_MAX:
            if len(self) >= INTERN_MAX:
                self.clear()
            self[wire] = sid
        return sid
