"""Consistent-hash mapping of streams onto queues.

Queues sit evenly spaced on a 32-bit ring: queue ``i`` sits at ``i * 2**32 // n`` and
owns the arc from there up to the next queue. A stream is placed by a stable hash of
its namespace and key (BLAKE2b, never Python's per-process salted ``hash()``), so
every producer in every process and every run puts the same stream on the same queue.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import StreamId

RING_SIZE = 1 << 32
MAX_QUEUES = 4096
"""The most queues a ring holds (``[queues] total``)."""


def stable_hash32(namespace: str, key: str) -> int:
    """A 32-bit hash of a stream that is identical in every process, run and platform."""
    data = namespace.encode() + b"\x00" + key.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")


@dataclass(frozen=True, slots=True)
class RingRange:
    """The half-open arc ``[start, end)`` of the ring; ``start > end`` wraps past zero."""

    start: int
    end: int

    def __contains__(self, point: int) -> bool:
        if self.start <= self.end:
            return self.start <= point < self.end
        return point >= self.start or point < self.end


class HashRingQueueMapper:
    """Maps each stream to exactly one of ``total_queues`` queues."""

    def __init__(self, total_queues: int = 8) -> None:
        if (not isinstance(total_queues, int) or isinstance(total_queues, bool)
                or not 1 <= total_queues <= MAX_QUEUES):  # 10**9 would fill the memory
            raise InvalidArgumentError(
                f"total_queues must be an int from 1 to {MAX_QUEUES} ([queues] total), got "
                f"{total_queues!r:.80}")
        self.total_queues = total_queues
        # Upper bound (exclusive) of each queue's arc; the last one is the ring size.
        self._bounds = [(i + 1) * RING_SIZE // total_queues for i in range(total_queues)]

    @property
    def queues(self) -> range:
        return range(self.total_queues)

    def queue_for_hash(self, point: int) -> int:
        return bisect.bisect_right(self._bounds, point)

    def queue_for(self, stream: StreamId) -> int:
        return self.queue_for_hash(stable_hash32(stream.namespace, stream.key))

    def queue_for_key(self, namespace: str, key: str) -> int:
        return self.queue_for_hash(stable_hash32(namespace, key))

    def position(self, queue: int) -> int:
        """The ring position of a queue (the start of its arc)."""
        return queue * RING_SIZE // self.total_queues

    def queues_for_range(self, ring_range: RingRange) -> list[int]:
        """The queues whose ring position lies inside ``ring_range``."""
        return [q for q in self.queues if self.position(q) in ring_range]
