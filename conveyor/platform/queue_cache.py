"""The per-agent queue cache: pulled messages, per-consumer cursors, the ack watermark.

Every message an agent pulls becomes an :class:`Entry`, kept in queue order until it
is acknowledged. Each handler subscribed to the message's namespace reads it through
its own *lane* — the cursor of one handler over one stream — so:

* a stream's messages reach each handler in queue order, one at a time;
* different streams, and different handlers of one stream, run concurrently;
* a slow handler holds the others back only through the cache's capacity bound.

A batch handler (``batch_size=N``) has no lanes: its entries go to its batcher, in
queue order (:mod:`conveyor.platform.batcher`).

An entry is *done* when every one of its handlers is done with it. Only the contiguous
done prefix of the cache is acknowledged, so a crash can only cause redelivery of
messages that were not (all) finished, never skip one.

The cache is bounded twice: in messages (``capacity``, ``[worker] cache_capacity``) and
in bytes by its share of the daemon's :class:`PrefetchBudget` (``[worker]
prefetch_bytes``). A message counts for its body's bytes and its headers' names and
values (:func:`~conveyor.platform.message.headers_size`: characters, bytes for ASCII) —
a producer may send small bodies with many KB of headers each; one without headers (the
common one) costs ``len`` of its body, as before. A queue cannot be asked for bytes,
only for a count, so :meth:`QueueCache.pull_size` turns the bytes left into a count with
the message size the last pulls brought.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from conveyor.platform.delivery.batch import BatchStep
from conveyor.platform.delivery.chain import Step
from conveyor.platform.delivery.dead_letter import DirectCall
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import Message, headers_size


class PrefetchBudget:
    """Bytes one daemon's agents may hold pulled and not yet acknowledged
    (``[worker] prefetch_bytes``), and what they hold.

    A cache joins when its agent's pull loop starts and leaves when it ends (a draining
    agent pulls no more; what it still holds stops counting), so the shares follow the
    queues the daemon owns. A cache pulls while it is under its even share *and* the
    daemon under its limit: an agent that started first and took more than its share
    pulls nothing more until its acknowledgements bring it under. An empty cache may
    always pull one message, so the daemon holds at most ``limit_bytes`` plus one message
    per queue. One event loop; no locking.
    """

    __slots__ = ("held_bytes", "limit_bytes", "pullers")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.pullers = 0
        self.held_bytes = 0

    def left_for(self, cache_bytes: int) -> int:
        """Bytes a cache holding ``cache_bytes`` may still pull."""
        share = self.limit_bytes // max(1, self.pullers)
        return min(share - cache_bytes, self.limit_bytes - self.held_bytes)


@dataclass(frozen=True, slots=True)
class Route:
    """A handler as an agent sees it: its place among the app's handlers, its chain
    (and for a ``batch_size=N`` handler the step its batches run through instead)."""

    index: int
    handler: HandlerSpec
    chain: Step
    batch: BatchStep | None = None
    direct: DirectCall | None = None
    """The chain's one step in parts, for the runner to call (the shipped chain, with
    metrics on or off: :class:`~conveyor.platform.delivery.dead_letter.DirectCall`);
    None: the runner awaits ``chain``."""


class Entry(msgspec.Struct, gc=False):
    """One pulled message: how many of its handlers still have to run it (``pending``;
    0: :attr:`done`).

    Entries and lanes are built per message and per stream, many thousands a second:
    as msgspec Structs untracked by the garbage collector (they hold no cycles: an entry
    refers only to its message, a lane to its entries and route) they cost a third of
    a slotted class to build and do not make the collector run more often. (``done`` is
    read off ``pending``, not stored: one field and one store a message less.)
    """

    msg: Message
    pending: int
    started: bool = False
    """A handler call on it has begun (a drain finishes such a message, hands others back)."""

    @property
    def done(self) -> bool:
        """Every handler it was routed to is done with it."""
        return not self.pending


class Lane(msgspec.Struct, gc=False):
    """One handler's cursor over one stream: the entries it still has to run, in order.

    ``running`` is set while a runner executes its entries (holding a slot for it).
    """

    key: str
    """The stream's key (a route takes one namespace): the lane's key in its route's
    dict of :attr:`QueueCache.lanes`."""
    route: Route
    entries: deque[Entry] = msgspec.field(default_factory=deque)
    running: bool = False


class QueueCache:
    """Entries in queue order, lanes with work, and the lanes ready to run.

    Not thread-safe; used from one event loop. A lane is in ``ready`` at most once and,
    while a runner works on its head entry, not at all — that is what keeps one
    stream's messages in order for one handler.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: deque[Entry] = deque()
        self.lanes: dict[int, dict[str, Lane]] = {}
        """Route index -> stream key -> the lane with work (a str key: its hash is
        cached, where a (route, stream) tuple is built and hashed per message)."""
        self.ready: deque[Lane] = deque()
        self.bytes = 0
        """Bytes of the entries held."""
        self.unconfirmed = 0
        """Entries done and taken out (:meth:`pop_done_prefix`) whose acknowledgement the
        broker has not confirmed yet (the :class:`~conveyor.platform.acks.Acknowledger`
        counts them): they still count against ``capacity``, which bounds what was
        pulled and not acknowledged — what a crash or a lost lease may run again."""
        self._body_bytes = 0
        """Size one message is expected to have: the last pull's average, or half
        the estimate before if that is more (it rises at once, falls by halves); 0 until
        the first pull."""
        self._budget: PrefetchBudget | None = None
        """The daemon's budget, between :meth:`join` and :meth:`leave`; None: no byte
        bound."""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def room(self) -> int:
        return self.capacity - len(self.entries) - self.unconfirmed

    def join(self, budget: PrefetchBudget) -> None:
        """Take a share of ``budget`` (the agent's pull loop starts)."""
        budget.pullers += 1
        budget.held_bytes += self.bytes
        self._budget = budget

    def leave(self) -> None:
        """Give the share back, and stop counting what is held (the pull loop ended)."""
        budget = self._budget
        if budget is not None:
            budget.pullers -= 1
            budget.held_bytes -= self.bytes
            self._budget = None

    def pull_size(self, max_batch: int) -> int:
        """How many messages to ask the queue for: within ``max_batch``, the room left
        in messages and, at the expected body size, in bytes (see
        :class:`PrefetchBudget`); 0 to wait for acknowledgements (the room counts the
        entries held and those whose acknowledgement is unconfirmed, :attr:`unconfirmed`).
        An empty cache asks for one message at least, room permitting (a body larger
        than the share still goes through, alone), and for exactly one before any pull
        has shown the body size."""
        room = min(self.capacity - len(self.entries) - self.unconfirmed, max_batch)
        budget = self._budget
        if budget is None:
            return room
        expected = self._body_bytes
        if not expected:
            return min(room, 1)
        fits = budget.left_for(self.bytes) // expected
        if fits <= 0:
            return 0 if self.entries else min(room, 1)
        return min(room, fits)

    @property
    def full(self) -> bool:
        """Whether the agent pulls nothing more (in messages or in bytes) until
        acknowledgements free room: a batch handler waiting for more runs what it has."""
        return self.pull_size(1) <= 0

    def took(self, messages: list[Message]) -> None:
        """Count a pull's messages (before its entries are added)."""
        size = 0
        for msg in messages:
            size += len(msg.body)
            if msg.headers:
                size += headers_size(msg.headers)
        self._count_taken(size, len(messages))

    def _count_taken(self, size: int, count: int) -> None:
        self.bytes += size
        if self._budget is not None:
            self._budget.held_bytes += size
        self._body_bytes = max(1, size // count, self._body_bytes // 2)

    def add_all(self, messages: list[Message],
                subscriptions: Mapping[str, tuple[Route, ...]]) -> list[Entry] | None:
        """Add a pull's messages, in queue order, to the lanes of the routes subscribed to
        their namespaces (``subscriptions``); the entries of those no route takes are kept
        in order too and returned (None if there are none), for the agent's orphans. They
        are counted as :meth:`took` counts them.

        One call per pull: the namespace's routes (and their lanes' dicts) are looked up
        once per run of messages of one namespace, and nothing is called per message; a
        namespace with one handler (the common case) takes no loop over its routes."""
        entries = self.entries
        append = entries.append
        lanes = self.lanes
        ready_append = self.ready.append
        unrouted: list[Entry] | None = None
        namespace: str | None = None
        routes: tuple[Route, ...] | None = None
        route: Route | None = None  # the namespace's only route
        by_key: dict[str, Lane] = {}  # its lanes
        several: list[tuple[Route, dict[str, Lane]]] = []  # or its routes and their lanes
        handlers = 0
        size = 0
        for msg in messages:
            size += len(msg.body)
            if msg.headers:  # no call for a message without
                size += headers_size(msg.headers)
            stream = msg.stream
            if stream.namespace != namespace:
                namespace = stream.namespace
                routes = subscriptions.get(namespace)
                handlers = len(routes) if routes is not None else 0
                if handlers == 1:
                    assert routes is not None
                    route = routes[0]
                    by_key = lanes.setdefault(route.index, {})
                elif routes is not None:
                    route = None
                    several = [(r, lanes.setdefault(r.index, {})) for r in routes]
            if routes is None:  # undecodable, or no handler of this app subscribes
                entry = Entry(msg, 1)
                append(entry)
                if unrouted is None:
                    unrouted = []
                unrouted.append(entry)
                continue
            entry = Entry(msg, handlers)
            append(entry)
            if route is not None:
                lane = by_key.get(stream.key)
                if lane is None:
                    lane = by_key[stream.key] = Lane(stream.key, route)
                    ready_append(lane)
                lane.entries.append(entry)
                continue
            for one, its_lanes in several:
                lane = its_lanes.get(stream.key)
                if lane is None:
                    lane = its_lanes[stream.key] = Lane(stream.key, one)
                    ready_append(lane)
                lane.entries.append(entry)
        self._count_taken(size, len(messages))
        return unrouted

    def add(self, entry: Entry, routes: tuple[Route, ...]) -> None:
        self.entries.append(entry)
        key = entry.msg.stream.key
        lanes = self.lanes
        for route in routes:
            by_key = lanes.setdefault(route.index, {})
            lane = by_key.get(key)
            if lane is None:
                lane = by_key[key] = Lane(key, route)
                self.ready.append(lane)
            lane.entries.append(entry)

    def drop_lane(self, lane: Lane) -> None:
        """``lane`` has no entries left: forget it."""
        del self.lanes[lane.route.index][lane.key]

    def finish_head(self, lane: Lane) -> Entry:
        """The lane's head entry is done for its handler; requeue the lane or drop it."""
        entry = lane.entries.popleft()
        if lane.entries:
            self.ready.append(lane)
        else:
            self.drop_lane(lane)
        entry.pending -= 1
        return entry

    def pop_done_prefix(self, tokens: list[SequenceToken]) -> None:
        """Remove the contiguous done entries at the front; append their tokens, to
        acknowledge, to ``tokens`` (no list of its own: it runs for about every message).

        When every entry held is done — a runner finished what was pulled before this
        ran, the common case of fast handlers — they go in bulk: one pass to check, one
        comprehension for the tokens, the bytes freed being all the cache counts."""
        entries = self.entries
        bulk = bool(entries)
        for entry in entries:
            if entry.pending:
                bulk = False
                break
        if bulk:
            tokens += [token for entry in entries if (token := entry.msg.token) is not None]
            entries.clear()
            freed = self.bytes
        else:
            freed = 0
            while entries and not entries[0].pending:
                msg = entries.popleft().msg
                freed += len(msg.body)
                if msg.headers:
                    freed += headers_size(msg.headers)
                if msg.token is not None:
                    tokens.append(msg.token)
        self.bytes -= freed
        if self._budget is not None:
            self._budget.held_bytes -= freed

