"""The embedded, in-process queue adapter: the default, no server needed.

It keeps the semantics of a durable backend inside one process — per-group cursors,
acknowledgements, redelivery of what a receiver took but did not acknowledge when it
shut down, retention that only drops what every group acknowledged — so everything
built on it behaves the same on Redis or Kafka. It does not survive the process.

Brokers are named; every :class:`MemoryAdapter` created with the same name in one
process shares one :class:`MemoryBroker`. A broker belongs to the event loop that
first uses it.

:data:`BACKEND` is the embedded broker's whole offer: this adapter, the in-process
membership and lease stores and idempotency keys shared by the daemons of one broker
name (no shared rate bucket: ``[slots.rate] store = "local"`` limits each daemon).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec

from conveyor.platform.adapter import (
    ConsumerGroups,
    DeadLetters,
    QueueAdapter,
    QueueReceiver,
    open_receivers,
)
from conveyor.platform.backend import Backend
from conveyor.platform.balancing.balancer import local_coordination
from conveyor.platform.balancing.leases import Lease, LeaseStore
from conveyor.platform.balancing.membership import Membership
from conveyor.platform.config import Config
from conveyor.platform.delivery.idempotency import IdempotencyStore, LocalIdempotencyStore
from conveyor.platform.errors import BrokerError, InvalidArgumentError, ShutdownError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import CONTENT_JSON, DeadLetter, Message
from conveyor.platform.operations.groups import GroupInfo, with_retention_holders

TRIM_EVERY = 4096


class _Log:
    """One queue: an append-only list of messages with a moving base offset."""

    __slots__ = ("base", "items", "waiters")

    def __init__(self) -> None:
        self.base = 0
        self.items: list[Message] = []
        self.waiters: list[asyncio.Future[None]] = []

    @property
    def end(self) -> int:
        return self.base + len(self.items)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Cursor:
    """One consumer group's position on one queue."""

    __slots__ = ("next_offset", "pending", "redeliver")

    def __init__(self, start: int) -> None:
        self.next_offset = start
        self.pending: dict[int, Message] = {}
        self.redeliver: deque[Message] = deque()

    def floor(self) -> int:
        """Every offset below this is acknowledged."""
        low = self.next_offset
        if self.pending:
            low = min(low, min(self.pending))
        if self.redeliver:
            low = min(low, min(m.token.major for m in self.redeliver if m.token))
        return low


def _as_json(message: Message, token: SequenceToken) -> Message:
    return msgspec.structs.replace(message, token=token, content_type=CONTENT_JSON)


class MemoryBroker:
    def __init__(self, name: str = "default") -> None:
        self.name = name
        self.logs: dict[int, _Log] = {}
        self.cursors: dict[tuple[str, int], _Cursor] = {}
        self.dead_letters: dict[str, list[StoredLetter]] = {}
        self._letters_stored = 0  # the last letter id handed out (ids are "1", "2", ...)
        # Receivers handed out and not yet shut down (weakly: a dropped one stops counting).
        self.receivers: weakref.WeakSet[MemoryReceiver] = weakref.WeakSet()
        self._appended_since_trim = 0

    def log(self, queue: int) -> _Log:
        log = self.logs.get(queue)
        if log is None:
            log = self.logs[queue] = _Log()
        return log

    def cursor(self, group: str, queue: int, *, at_end: bool = False) -> _Cursor:
        key = (group, queue)
        cursor = self.cursors.get(key)
        if cursor is None:
            # A new group starts at the oldest retained message (nothing published before
            # its first consumer is skipped), or with at_end at what comes next.
            log = self.log(queue)
            cursor = self.cursors[key] = _Cursor(log.end if at_end else log.base)
        return cursor

    def append(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        log = self.log(queue)
        offset = log.end
        tokens = [SequenceToken(queue, offset + i) for i in range(len(messages))]
        # An empty content type reads as JSON, as the brokers read an empty field.
        log.items.extend(m.with_token(t) if m.content_type else _as_json(m, t)
                         for m, t in zip(messages, tokens, strict=True))
        self._appended_since_trim += len(messages)
        if self._appended_since_trim >= TRIM_EVERY:
            self.trim()
        log.wake()
        return tokens

    def lag(self, queue: int, group: str) -> int:
        log = self.log(queue)
        c = self.cursors.get((group, queue))  # reading creates no group
        if c is None:
            return log.end - log.base  # a new group would read everything retained
        return (log.end - c.next_offset) + len(c.pending) + len(c.redeliver)

    def letter_id(self) -> str:
        self._letters_stored += 1
        return str(self._letters_stored)

    def trim(self) -> None:
        """Drop messages every group has acknowledged (retention)."""
        self._appended_since_trim = 0
        for queue, log in self.logs.items():
            floors = [c.floor() for (_, q), c in self.cursors.items() if q == queue]
            if not floors:
                continue  # no group has read this queue yet: keep everything
            cut = min(floors) - log.base
            if cut > 0:
                del log.items[:cut]
                log.base += cut


def _letter_number(letter_id: str) -> int:
    if not (letter_id.isascii() and letter_id.isdigit()):
        raise InvalidArgumentError(
            f"not a dead-letter id of the memory adapter: {letter_id!r} (expected a number)"
        )
    return int(letter_id)


_BROKERS: dict[str, MemoryBroker] = {}


def broker(name: str = "default") -> MemoryBroker:
    """The process's broker of that name, created on first use."""
    found = _BROKERS.get(name)
    if found is None:
        found = _BROKERS[name] = MemoryBroker(name)
    return found


def reset_broker(name: str = "default") -> None:
    """Forget a named broker and everything in it (tests, repeated demos)."""
    _BROKERS.pop(name, None)


class MemoryReceiver(QueueReceiver):
    in_process = True

    def __init__(self, broker: MemoryBroker, queue: int, group: str, *,
                 at_end: bool = False) -> None:
        self._broker = broker
        self._queue = queue
        self._group = group
        self._log = broker.log(queue)
        self._cursor = broker.cursor(group, queue, at_end=at_end)
        self._closed = False
        self._holder = "a receiver in this process"

    def set_lease(self, lease: Lease | None) -> None:
        if lease is not None:
            self._holder = lease.owner

    def holder(self, queue: int, group: str) -> str | None:
        """Who this receiver is while it is open on ``queue`` for ``group`` (owners())."""
        if self._closed or self._queue != queue or self._group != group:
            return None
        return self._holder

    async def initialize(self) -> None:
        self._closed = False

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        if self._closed:
            raise ShutdownError(f"receiver of queue {self._queue} is shut down")
        out = self._take(max_count)
        if out or timeout_s <= 0:
            return out
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._log.waiters
        waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):  # wait_for can lose a cancel (3.11)
                await waiter
        except TimeoutError:
            return []
        finally:
            # A waiter that timed out (or was cancelled) is still listed until the
            # next append; on an idle queue every empty poll would leave one behind.
            # (wake() swaps the list out, so a woken waiter is simply not found.)
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
        return self._take(max_count)

    def _take(self, max_count: int) -> list[Message]:
        cursor = self._cursor
        log = self._log
        out: list[Message] = []
        while cursor.redeliver and len(out) < max_count:
            out.append(cursor.redeliver.popleft())
        start = cursor.next_offset - log.base
        if start < 0:  # trimmed past our position (cannot happen while we hold pending)
            raise BrokerError(f"queue {self._queue}: position {cursor.next_offset} was trimmed")
        pending = cursor.pending
        for m in out:  # redelivered
            pending[m.token.major] = m  # type: ignore[union-attr]
        fresh = log.items[start : start + max_count - len(out)]
        first = cursor.next_offset
        cursor.next_offset += len(fresh)
        pending.update(zip(range(first, first + len(fresh)), fresh, strict=True))
        out.extend(fresh)
        return out

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        forget = self._cursor.pending.pop
        for token in tokens:
            forget(token.major, None)

    async def lag(self) -> int:
        c = self._cursor
        return (self._log.end - c.next_offset) + len(c.pending) + len(c.redeliver)

    async def shutdown(self) -> None:
        """Unacknowledged messages go back, in queue order, to be delivered first."""
        if self._closed:
            return
        self._closed = True
        c = self._cursor
        back = sorted(
            [*c.pending.values(), *c.redeliver],
            key=lambda m: m.token.major,  # type: ignore[union-attr]
        )
        c.pending.clear()
        c.redeliver = deque(back)


class MemoryDeadLetters(DeadLetters):
    """Dead letters in the broker, per app; ids are a counter per broker."""

    def __init__(self, broker: MemoryBroker, max_entries: int = 0) -> None:
        self._broker = broker
        self._max_entries = max_entries
        """``[dead_letters] max_entries``: 0 keeps every letter."""

    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        kept = self._broker.dead_letters.setdefault(group, [])
        kept.extend(StoredLetter(self._broker.letter_id(), letter) for letter in letters)
        evicted = len(kept) - self._max_entries if self._max_entries else 0
        if evicted > 0:
            del kept[:evicted]
        return max(evicted, 0)

    async def page(self, group: str, limit: int = 100, *, after: str | None = None,
                   until: str | None = None) -> list[StoredLetter]:
        kept = self._broker.dead_letters.get(group, [])
        start = 0
        if after is not None:
            last = _letter_number(after)
            start = next((i for i, s in enumerate(kept) if int(s.id) > last), len(kept))
        found = kept[start : start + limit]
        if until is not None:
            end = _letter_number(until)
            found = [s for s in found if int(s.id) <= end]
        return found

    async def mark(self, group: str) -> str | None:
        """The newest letter's id: the broker's counter only grows."""
        kept = self._broker.dead_letters.get(group, [])
        return kept[-1].id if kept else None

    def check_id(self, letter_id: str) -> None:
        _letter_number(letter_id)

    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        _letter_number(letter_id)
        return next((s for s in self._broker.dead_letters.get(group, []) if s.id == letter_id),
                    None)

    async def count(self, group: str) -> int:
        return len(self._broker.dead_letters.get(group, []))

    async def delete(self, group: str, ids: Sequence[str]) -> int:
        for letter_id in ids:
            _letter_number(letter_id)
        kept = self._broker.dead_letters.get(group, [])
        gone = set(ids)
        self._broker.dead_letters[group] = [s for s in kept if s.id not in gone]
        return len(kept) - len(self._broker.dead_letters[group])

    async def replay(self, group: str, replays: Sequence[Replay]
                     ) -> list[SequenceToken | None]:
        """Append and remove with no await in between: nothing can interrupt it."""
        for replay in replays:
            _letter_number(replay.letter_id)
        kept = self._broker.dead_letters.get(group, [])
        stored = {s.id for s in kept}
        out: list[SequenceToken | None] = []
        for replay in replays:
            if replay.letter_id in stored:
                stored.discard(replay.letter_id)
                out.append(self._broker.append(replay.queue, [replay.message])[0])
            else:
                out.append(None)
        self._broker.dead_letters[group] = [s for s in kept if s.id in stored]
        return out


class MemoryGroups(ConsumerGroups):
    """The broker's cursors: one per group and queue it read."""

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    async def on(self, queues: Sequence[int]) -> list[GroupInfo]:
        out: list[GroupInfo] = []
        for queue in queues:
            log = self._broker.log(queue)
            infos = []
            for (group, q), c in sorted(self._broker.cursors.items()):
                if q != queue:
                    continue
                floor = c.floor()
                needed = log.items[floor - log.base] if log.base <= floor < log.end else None
                infos.append(GroupInfo(
                    group, queue, self._broker.lag(queue, group),
                    oldest_needed=needed.token if needed else None,
                    oldest_needed_ms=needed.enqueued_at_ms if needed else None,
                    appended=log.end,
                ))
            out += with_retention_holders(infos)
        return out

    async def delete(self, group: str, queues: Sequence[int], *,
                     dead_letters: bool = False) -> list[int]:
        removed = [q for q in queues if self._broker.cursors.pop((group, q), None) is not None]
        if dead_letters:
            self._broker.dead_letters.pop(group, None)
        return removed


class MemoryAdapter(QueueAdapter):
    name = "memory"
    coalesce_publishes = False  # an in-process append: no round trip to share

    def __init__(self, broker_name: str = "default", *, max_dead_letters: int = 0,
                 new_group_start: str = "earliest") -> None:
        self.broker = broker(broker_name)
        self.dead_letters = MemoryDeadLetters(self.broker, max_dead_letters)
        self.groups = MemoryGroups(self.broker)
        self.new_groups_at_end = new_group_start == "latest"

    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        return self.broker.append(queue, messages)

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = MemoryReceiver(self.broker, queue, group, at_end=self.new_groups_at_end)
        self.broker.receivers.add(receiver)
        return receiver

    def _offset(self, queue: int, to: SequenceToken | float) -> int:
        log = self.broker.log(queue)
        if isinstance(to, SequenceToken):
            return to.major
        stamps = [m.enqueued_at_ms for m in log.items]
        return log.base + bisect.bisect_left(stamps, int(to * 1000))

    async def forward_gap(self, queue: int, group: str, to: SequenceToken | float) -> int:
        log = self.broker.log(queue)
        offset = min(self._offset(queue, to), log.end)
        cursor = self.broker.cursors.get((group, queue))  # reading creates no group
        if cursor is None:
            return max(0, offset - log.base)
        taken = [*cursor.pending, *(m.token.major for m in cursor.redeliver if m.token)]
        return max(0, offset - cursor.next_offset) + sum(1 for o in taken if o < offset)

    async def owners(self, queues: Sequence[int], group: str) -> dict[int, str]:
        """The broker's open receivers of ``group``: every one in the process, whichever
        adapter object handed it out (the broker is the whole backend)."""
        return open_receivers(self.broker.receivers, queues, group)

    async def rewind(self, queue: int, group: str, to: SequenceToken | float) -> None:
        log = self.broker.log(queue)
        offset = self._offset(queue, to)
        if offset < log.base:
            raise BrokerError(
                f"queue {queue}: offset {offset} was already trimmed (oldest kept: {log.base})"
            )
        cursor = self.broker.cursor(group, queue)
        cursor.next_offset = min(offset, log.end)
        cursor.pending.clear()
        cursor.redeliver.clear()

    async def lag(self, queue: int, group: str) -> int:
        return self.broker.lag(queue, group)


def from_config(config: Any) -> MemoryAdapter:
    return MemoryAdapter(config.memory.broker, max_dead_letters=config.dead_letters.max_entries,
                         new_group_start=config.queues.new_group_start)


def coordination(config: Config, group: str) -> tuple[Membership, LeaseStore]:
    """The stores every daemon of app ``group`` on this process's broker shares."""
    return local_coordination(f"{config.memory.broker}/{group}")


def idempotency_store(config: Config, group: str) -> IdempotencyStore:
    """Shared by the daemons of one broker name (the keys of every app on it)."""
    return LocalIdempotencyStore.shared(config.memory.broker)


def describe(config: Config) -> str:
    return f"memory (broker {config.memory.broker!r} in this process)"


BACKEND = Backend("memory", from_config, coordination=coordination,
                  idempotency_store=idempotency_store, describe=describe, in_process=True)
