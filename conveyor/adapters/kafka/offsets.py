"""The commit watermark of one partition, plus the done offsets above it.

Kafka remembers one position per partition and group. Committing the position of the
last *acknowledged* message would skip a message still running below it; committing
only the contiguous done prefix (the watermark) is safe but makes the next owner redo
everything done above it. :class:`DoneOffsets` keeps both: the watermark, and the set
of offsets above it that are already done. The set travels with the commit as
metadata (:func:`encode` / :func:`decode`), so after a hand-off the next owner starts
at the watermark and skips exactly the offsets that were done.

Encoding (``cv1:`` prefix, then comma-separated ranges relative to the watermark):
``cv1:2-4,9`` with watermark 100 means offsets 102, 103, 104 and 109 are done. When
the text would exceed ``max_bytes`` the highest ranges are dropped: losing a done
offset only causes a redelivery, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "cv1:"
MAX_METADATA_BYTES = 4000  # Kafka's default offset.metadata.max.bytes is 4096


def encode(watermark: int, done: Iterable[int], max_bytes: int = MAX_METADATA_BYTES) -> str:
    """The metadata text for ``done`` offsets above ``watermark`` ('' when none)."""
    rel = sorted(o - watermark for o in done if o > watermark)
    if not rel:
        return ""
    parts: list[str] = []
    size = len(PREFIX)
    start = prev = rel[0]
    for o in [*rel[1:], None]:
        if o is not None and o == prev + 1:
            prev = o
            continue
        part = str(start) if start == prev else f"{start}-{prev}"
        size += len(part) + (1 if parts else 0)
        if size > max_bytes:
            break
        parts.append(part)
        if o is not None:
            start = prev = o
    return PREFIX + ",".join(parts) if parts else ""


def decode(watermark: int, text: str | None) -> set[int]:
    """The done offsets recorded in ``text`` (anything not ours decodes to none)."""
    if not text or not text.startswith(PREFIX):
        return set()
    done: set[int] = set()
    try:
        for part in text[len(PREFIX) :].split(","):
            lo, _, hi = part.partition("-")
            a = int(lo)
            b = int(hi) if hi else a
            if a <= 0 or b < a:
                return set()
            done.update(range(watermark + a, watermark + b + 1))
    except ValueError:
        return set()
    return done


def unfinished(high: int, log_start: int, watermark: int, text: str | None) -> int:
    """What a group that committed ``watermark`` (with ``text``'s done offsets) has left
    to handle of a partition holding ``log_start`` up to ``high``: records deleted by
    retention before it handled them are not counted — no worker can read them (the
    receiver reports them lost when it moves past them)."""
    start = max(watermark, log_start)
    done = sum(1 for offset in decode(watermark, text) if start <= offset < high)
    return max(0, high - start - done)


class DoneOffsets:
    """Watermark and done-above-watermark set of one partition (one owner at a time)."""

    __slots__ = ("done", "watermark")

    def __init__(self, watermark: int, done: Iterable[int] = ()) -> None:
        self.watermark = watermark
        self.done = {o for o in done if o >= watermark}
        self._advance()

    def _advance(self) -> None:
        done = self.done
        while self.watermark in done:
            done.discard(self.watermark)
            self.watermark += 1

    def mark_done(self, offset: int) -> None:
        if offset >= self.watermark:
            self.done.add(offset)

    def acknowledge_through(self, offset: int) -> None:
        """Everything up to and including ``offset`` is done (the agent's done prefix)."""
        if offset >= self.watermark:
            self.watermark = offset + 1
            if self.done:
                self.done = {o for o in self.done if o > offset}
                self._advance()

    def metadata(self) -> str:
        return encode(self.watermark, self.done) if self.done else ""
