"""The queue-adapter port: what the platform needs from a durable queue backend.

The platform owns these interfaces; each broker's adapter implements them. An adapter
knows nothing of handlers: it moves :class:`Message` values in and out of numbered
queues and remembers, per consumer group, what was acknowledged.

Delivery contract (every adapter, the memory one included):

* ``get_messages`` returns messages of one queue in queue order, each with its
  ``token`` set; a message returned once is not returned again by the same receiver
  unless the queue is rewound.
* ``acknowledge`` acknowledges; an acknowledged message is never delivered to
  the group again (short of a rewind).
* A message delivered but not acknowledged when its receiver shuts down (or dies) is
  delivered again by the next receiver of that queue: at least once, never lost.

The port is narrow on purpose: :class:`QueueAdapter` is the hot path (``enqueue``,
``create_receiver``, ``lag``) plus rewinding, which the workers and ``conveyor rewind``
need; the rest is two **facets**, objects of their own that an adapter
hands out as attributes: ``adapter.dead_letters`` (:class:`DeadLetters`: put, read,
page, find, count, delete, replay — the agent's one write goes there too) and
``adapter.groups`` (:class:`ConsumerGroups`: on, has, require, delete). Each backend
implements a facet in its own module (``adapters/redis/letters.py``, ...) holding only
the connections it needs. The ABCs stay in this one module, beside the adapter, so the
whole port still reads in one sitting.

These promises, lag, rewind's checks and dead letters are one test suite,
``tests/contract/``, run against every adapter: a new adapter is done when it passes.

The receiver's life cycle follows Orleans' persistent-streams receiver (``Initialize``,
``GetQueueMessagesAsync``, ``MessagesDeliveredAsync``, ``Shutdown``); its acknowledging
call is named for what it does, ``acknowledge``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from conveyor.platform.balancing.leases import Lease
from conveyor.platform.errors import (
    BrokerError,
    ConveyorError,
    ForwardRewindError,
    QueueOwnedError,
    TokenRangeError,
)
from conveyor.platform.ids import POSITION_MAX, SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.operations.groups import GroupInfo, no_group_error


class QueueReceiver(ABC):
    """The consumer side of one queue, for one consumer group."""

    in_process: bool = False
    """True when the queue lives in this process (the embedded adapter): what is not
    acknowledged when the process ends is gone, not redelivered."""

    records_lost: int = 0
    """Messages of the queue the broker deleted before they were handled, as far as this
    receiver found (Kafka: retention passed the group's position); a daemon publishes it
    with its heartbeat (``queue.N.lost``) and ``conveyor status`` shows it. Read once a
    heartbeat, never on the hot path."""

    records_done_out_of_order: bool = False
    """True if the agent should report messages finished above the ack watermark.

    Backends that commit a single position (Kafka) set it, record those tokens with
    :meth:`message_done_out_of_order`, and persist them with the next acknowledgement,
    so the next owner of the queue can skip them. The agent then also calls
    ``acknowledge([])`` once when it drains, to persist what is still recorded.
    """

    def message_done_out_of_order(self, token: SequenceToken) -> None:  # noqa: B027
        """A message finished while an earlier one of the queue is still unfinished.

        Called synchronously from the agent's hot path (only when
        ``records_done_out_of_order``): record, do not perform I/O.
        """

    def set_lease(self, lease: Lease | None) -> None:  # noqa: B027 - optional hook
        """The lease under which this receiver runs (called before ``initialize``).

        Backends that can fence (refuse acks from a stale owner) check its token on
        every acknowledgement; the others ignore it.
        """

    def holder(self, queue: int, group: str) -> str | None:
        """Who this receiver is while it is open — handed out and not shut down — on
        ``queue`` for ``group``; None otherwise (see :func:`open_receivers`)."""
        return None

    @abstractmethod
    async def initialize(self) -> None:
        """Connect and position the receiver; unacknowledged messages come first."""

    @abstractmethod
    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        """Up to ``max_count`` messages, waiting at most ``timeout_s`` for the first one.

        Returns an empty list when nothing arrived in time. Cancellable.
        """

    @abstractmethod
    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        """Acknowledge these messages: they are done for this group."""

    async def handed_back(self, tokens: Sequence[SequenceToken], *,  # noqa: B027
                          all_unfinished: bool = False) -> None:
        """A graceful drain hands these messages back unstarted (on their first
        delivery): the backend may undo the delivery it counted for them, so that the
        next owner does not take them for redelivered ones (whose starts are counted,
        one at a time).
        ``all_unfinished``: nothing else is left unfinished (no handler call was
        abandoned by the drain)."""

    async def count_start(self, msg: Message) -> Message:
        """Record, durably, that a handler is about to start ``msg``, which was delivered
        before (``msg.deliveries > 1``), and return it with ``deliveries`` = the times a
        handler has started it since its first delivery, this time included, plus one
        (the first delivery's), and ``last_cause`` where a worker recorded one.

        Only redelivered messages pay this round trip (the agent counts their starts one
        at a time, see ``PullingAgent._count_start``): what the next owner needs after
        another crash is how often the message was *started*, not how often it was
        read, so the messages held unstarted behind a poison one (in its stream, or in
        the batch it killed) are not blamed for it. A backend that cannot record it
        returns ``msg`` as it is (every read counted as a start).
        """
        return msg

    @abstractmethod
    async def lag(self) -> int:
        """Messages of this queue the group has not yet finished (undelivered + pending)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop receiving; unacknowledged messages become deliverable to the next owner."""


@dataclass(frozen=True)
class StoreProblem:
    """A place where an adapter keeps queued messages or dead letters that holds
    something else, or is set to delete them (:meth:`QueueAdapter.store_problems`)."""

    store: str
    """The broker's name of it (a Redis key, a Kafka topic)."""
    holds: str
    """What Conveyor keeps there: ``queue 3``, ``app 'shop''s dead letters``."""
    found: str
    """What is there instead, as the broker names it (a Redis key's type:
    ``string``), or the setting (``cleanup.policy=compact``)."""
    warning: str
    """One line for an operator: the store, what it costs, what to do."""


class DeadLetters(ABC):
    """The dead-letter facet (``QueueAdapter.dead_letters``): every app's letters.

    The agent stores through :meth:`put` (via
    :class:`conveyor.platform.delivery.DeadLetterStore`, which retries and shortens);
    operators (``conveyor dlq``, the console, :mod:`conveyor.platform.operations.dlq`)
    use the rest. Letters are in the layout of :mod:`conveyor.platform.letters`. A
    letter's id is the store's own (see :class:`StoredLetter`); a malformed one raises
    :class:`InvalidArgumentError`, an unknown one is simply not there.
    """

    @abstractmethod
    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """Store messages that could not be handled, durably, before they are acked.

        Returns how many older letters a configured bound (``[dead_letters]
        max_entries``) evicted to make room; 0 without one. Raises
        :class:`BrokerConnectionError` while the store cannot be reached (the caller
        retries), anything else when these letters cannot be stored as they are (the
        caller stores a shorter form, see ``DeadLetter.shortened``).
        """

    async def read(self, group: str, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of a group (for operators and tests)."""
        return [stored.letter for stored in await self.page(group, limit)]

    @abstractmethod
    async def page(self, group: str, limit: int = 100, *, after: str | None = None,
                   until: str | None = None) -> list[StoredLetter]:
        """Up to ``limit`` of ``group``'s letters, oldest first, from just after the
        letter ``after`` (None: from the oldest) up to the letter ``until`` (included;
        None: to the newest). Removed letters are not listed; ``after`` and ``until``
        need not be stored still (a letter removed since it was listed pages on from
        where it was).

        An empty page means no letter is left up to ``until``; a page may be shorter
        than ``limit`` with more to come. Where the store can hold entries that are no
        letters (a Redis dead-letter stream another tool wrote to, a Kafka dead-letter
        topic's records of other apps or tools, a corrupt entry), they are skipped and
        the store reads on past them until it has a letter or the range ends — however
        many come first: a caller that stopped at an empty page never stopped before
        letters stored behind them. (The store decides how far it reads; the caller
        cannot resume from an entry that is no letter, since it never sees its id.)"""

    @abstractmethod
    async def mark(self, group: str) -> str | None:
        """An id for :meth:`page`'s ``until`` that stops at the letters stored now: every
        letter of ``group`` stored now is at or before it, every one stored later after
        it; None when nothing is (a store may give an id then too: paging up to it
        finds none). ``conveyor dlq replay --all`` stops there: a replayed message
        that fails again is not replayed again in the same run."""

    @abstractmethod
    def check_id(self, letter_id: str) -> None:
        """Raise :class:`InvalidArgumentError` when no letter of this store could have
        ``letter_id``, saying what one looks like (as :meth:`find` and the others do).
        It asks no server: a command refuses a mistyped id before anything else."""

    @abstractmethod
    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        """The letter of ``group`` with that id, or None if it is not (or no longer) stored."""

    @abstractmethod
    async def count(self, group: str) -> int:
        """How many letters of ``group`` are stored (what :meth:`page` lists; on Redis
        the stream's length, which counts entries that are no letters too)."""

    @abstractmethod
    async def delete(self, group: str, ids: Sequence[str]) -> int:
        """Remove these letters of ``group``; returns how many were stored. Unknown ids
        are skipped."""

    @abstractmethod
    async def replay(self, group: str, replays: Sequence[Replay]) -> list[SequenceToken | None]:
        """For each replay, append its message to its queue, then remove its letter.

        Returns, in order, where each message went; None for a letter no longer stored
        (replayed or purged meanwhile), for which nothing is published. A letter goes
        only once its append is confirmed, and replays interrupted at any point (the
        process killed) and called again publish each message once in all: each backend
        says how in its docstring. The caller builds the messages and picks the queues
        (conveyor.platform.operations.dlq: the same mapper as every publish).
        """


class ConsumerGroups(ABC):
    """The consumer-group facet (``QueueAdapter.groups``): every app's groups, for
    operators (``conveyor status``, ``conveyor groups``, rewind's check)."""

    retention_follows_groups: bool = True
    """True where retention keeps what any group still needs (memory, Redis), so a group
    nobody runs stops trimming; False where it goes by time or size alone (Kafka)."""

    @abstractmethod
    async def on(self, queues: Sequence[int]) -> list[GroupInfo]:
        """Every consumer group on ``queues`` (every app's, not one): one
        :class:`GroupInfo` per group and queue it has a position on, ordered by queue.

        Reading creates no group. ``holds_retention`` is set as the backend trims:
        never where :attr:`retention_follows_groups` is False.
        """

    async def has(self, queues: Sequence[int], group: str) -> bool:
        """Whether ``group`` has a position on any of ``queues``."""
        return any(info.group == group for info in await self.on(queues))

    async def require(self, queues: Sequence[int], group: str, *,
                      create_group: bool = False) -> None:
        """Refuse (:class:`UnknownGroupError`) an app with no group on any of ``queues``.

        Moving such an app would create a group nobody runs, which on backends whose
        retention follows groups stops trimming for good. ``create_group`` allows it.
        """
        if not create_group and not await self.has(queues, group):
            raise no_group_error(
                group, queues, "pass --create-group (create_group=True) to create it there"
            )

    @abstractmethod
    async def delete(self, group: str, queues: Sequence[int], *,
                     dead_letters: bool = False) -> list[int]:
        """Remove ``group`` from every queue of ``queues``; the queues it was on.

        Also removes what the backend keeps for that app alone (Redis: its leases, fencing
        counters and membership); its dead letters only with ``dead_letters``. Unchecked:
        the caller makes sure no daemon of the app runs (see
        :func:`conveyor.platform.operations.groups.delete_app_group`).
        """


class QueueAdapter(ABC):
    """A queue backend: the producer side, a factory of receivers, rewinding — and two
    facets for operators, set by each adapter's constructor as objects of their own."""

    dead_letters: DeadLetters
    """Every app's dead letters: stored by the agent, read and replayed by operators."""

    groups: ConsumerGroups
    """Every app's consumer groups on the queues."""

    name: str = "abstract"
    coalesce_publishes: bool = True
    """Whether a client gathers concurrent single publishes into rounds of sends
    (:mod:`conveyor.platform.coalescer`): worth it where each send is a round trip.
    False where there is none (memory) or where the backend's own client gathers
    concurrent sends already, in call order (Kafka's producer, ``linger_ms``)."""
    publishes_queues_together: bool = False
    """Whether :meth:`enqueue_queues` sends several queues in one round trip (Redis: one
    pipeline), so that gathered publishes send a round's queues together; else one send
    a queue, each on its own (a Redis Cluster: its queues live on different nodes, and
    one whose node fails over must hold no other back)."""

    max_headers: int | None = None
    """The most headers of its own a message may carry on this backend (None: no limit
    of its own): a client refuses a message with more while it builds it, before any
    send (a ``publish_batch`` whole), with :class:`MessageTooLargeError`."""

    token_max: tuple[int, int] = (POSITION_MAX, POSITION_MAX)
    """The largest ``(major, minor)`` of this backend's positions: what
    :meth:`check_token` allows. Here what a token's text form allows, 2**64-1 each (a
    Redis stream id's two parts); Kafka's offsets are signed 64-bit numbers."""

    def check_token(self, token: SequenceToken) -> None:
        """Refuse a token that names no position this backend can have (a part below 0
        or above :attr:`token_max`) with a :class:`TokenRangeError`, before the broker
        is asked."""
        for name, value, top in (("major", token.major, self.token_max[0]),
                                 ("minor", token.minor, self.token_max[1])):
            if not 0 <= value <= top:
                raise TokenRangeError(
                    f"token {token}: its {name} part is out of the {self.name} adapter's "
                    f"range 0..{top}"
                )

    def check_time(self, when: float) -> None:  # noqa: B027 - optional hook
        """Refuse a rewind's time (UNIX seconds) this backend can keep no position at with
        a :class:`TokenRangeError`, before the broker is asked, with ``allow_forward`` or
        without. None here: a time past a queue's end is only forward (Redis keeps the
        position at the time; :meth:`skips_unpublished`)."""

    @abstractmethod
    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        """Append messages to a queue, in order; returns their positions."""

    async def enqueue_queues(
        self, batches: Mapping[int, Sequence[Message]]
    ) -> dict[int, list[SequenceToken] | Exception]:
        """:meth:`enqueue` of several queues at once: each queue's positions, or the error
        its messages got (what :meth:`enqueue` of that queue alone would have raised).
        Queues do not wait on each other's fate; a queue's messages are appended in
        order. Here one :meth:`enqueue` per queue, concurrently; an adapter whose sends
        are round trips overrides it with one round trip for all (Redis: one pipeline),
        which is what gathered single publishes use (:mod:`conveyor.platform.coalescer`)."""
        queues = list(batches)
        outcomes = await asyncio.gather(*(self.enqueue(q, batches[q]) for q in queues),
                                        return_exceptions=True)
        out: dict[int, list[SequenceToken] | Exception] = {}
        for queue, outcome in zip(queues, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled, or the process is going down
            out[queue] = outcome
        return out

    @abstractmethod
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        """A receiver of ``queue`` for consumer group ``group`` (not yet initialized)."""

    @abstractmethod
    async def rewind(self, queue: int, group: str, to: SequenceToken | float) -> None:
        """Move ``group``'s position on ``queue`` to a token of that queue or a UNIX time
        (seconds): messages from that point on are delivered again.

        Unchecked (no token, owner or direction check): call :meth:`rewind_queues`.
        """

    @abstractmethod
    async def forward_gap(self, queue: int, group: str, to: SequenceToken | float) -> int:
        """How many messages ``group`` has not finished on ``queue`` that moving its
        position to ``to`` would skip: 0 unless ``to`` is ahead of its position. Those
        published so far only: :meth:`skips_unpublished` says what a target past the
        queue's end skips of the rest. A backend that keeps no position past a queue's
        end refuses a target there (:class:`TokenRangeError`)."""

    async def skips_unpublished(self, queue: int, to: SequenceToken | float) -> str | None:
        """What moving a position on ``queue`` to ``to`` would skip of the messages not
        yet published, in a phrase ("every message published until …"), or None.

        A target past the queue's end, kept as given, skips every message published
        until the queue's positions reach it (Redis: until the stream's ids, the server's
        clock in ms, pass it). None here: a backend that keeps a position at most at a
        queue's end (the memory broker moves it there; Kafka refuses a target past it,
        :meth:`forward_gap`) skips none of them."""
        return None

    @abstractmethod
    async def owners(self, queues: Sequence[int], group: str) -> dict[int, str]:
        """Which of ``queues`` a receiver of ``group`` still owns, and who (queue: holder).

        Each backend reports what it can see; every one sees the receivers this adapter
        (in-process) handed out and has not shut down. Say in the docstring what the
        backend cannot see: :meth:`rewind_queues` also takes the daemons' leases.
        """

    async def rewind_queues(self, queues: Sequence[int], group: str, to: SequenceToken | float,
                            *, allow_forward: bool = False, create_group: bool = False,
                            lease_owners: Mapping[int, str] | None = None) -> list[str]:
        """Move ``group``'s position on every queue of ``queues`` to ``to``, checked;
        returns what the move skips, a phrase per queue that skips any (only with
        ``allow_forward``: ``queue 0: 3 message(s) skipped``), for the caller to say.

        Refused before any queue moves:

        * a token out of this backend's range (:meth:`check_token`), a time it keeps no
          position at (:meth:`check_time`);
        * a token of another queue than one of ``queues`` (:class:`BrokerError`);
        * a queue still owned by a receiver of ``group`` — one :meth:`owners` sees, or one
          in ``lease_owners`` (queue: holder, e.g. the daemons' lease store, which
          ``conveyor rewind`` reads) — (:class:`QueueOwnedError`): moving a position
          under a running receiver is undone by its next acknowledgement;
        * an app with no group on any of ``queues`` (:meth:`ConsumerGroups.require`), unless
          ``create_group``: moving it would create a group nobody runs;
        * a target ahead of the group's position, which would skip messages never
          handled (:class:`ForwardRewindError`), unless ``allow_forward``: those
          published so far (:meth:`forward_gap`), and, for a target past the queue's
          end, those published until the queue reaches it (:meth:`skips_unpublished`),
          whatever the group's position.

        Then the queues move one at a time (:meth:`rewind`); if one fails, the error
        names those already moved (re-running the same rewind finishes the job).
        """
        if not isinstance(to, SequenceToken):
            # Before 1970 (UNIX time 0) is before every message: the start, which Kafka's
            # offset lookup takes as 0 and refuses as a negative time.
            to = max(to, 0.0)
            self.check_time(to)
        else:
            self.check_token(to)
            for queue in queues:
                if to.queue != queue:
                    raise BrokerError(f"token {to} is for queue {to.queue}, not {queue}")
        held = {**(lease_owners or {}), **await self.owners(queues, group)}
        owned = [f"queue {q} by {held[q]}" for q in queues if q in held]
        if owned:
            raise QueueOwnedError(
                f"queues of app {group!r} are still owned ({'; '.join(owned)}): stop the "
                "app's workers before rewinding"
            )
        await self.groups.require(queues, group, create_group=create_group)
        ahead = [f"queue {queue}: {skipped} skipped" for queue in queues
                 if (skipped := await self._skipped(queue, group, to))]
        if ahead and not allow_forward:
            raise ForwardRewindError(
                f"that target is ahead of app {group!r}'s position, so messages never "
                f"handled would be skipped: {'; '.join(ahead)}; pass --allow-forward "
                "(allow_forward=True) to skip them on purpose"
            )
        moved: list[int] = []
        for queue in queues:
            try:
                await self.rewind(queue, group, to)
            except ConveyorError as exc:
                if not moved:
                    raise
                raise BrokerError(
                    f"rewinding app {group!r} failed on queue {queue} ({exc}); queues "
                    f"{moved} were already moved: re-run the same rewind to finish"
                ) from exc
            moved.append(queue)
        return ahead

    async def _skipped(self, queue: int, group: str, to: SequenceToken | float) -> str:
        """What moving ``group`` to ``to`` on ``queue`` skips, or "" (nothing)."""
        gap = await self.forward_gap(queue, group, to)
        parts = [f"{gap} message(s)"] if gap else []
        if unpublished := await self.skips_unpublished(queue, to):
            parts.append(unpublished)
        return " and ".join(parts)

    @abstractmethod
    async def lag(self, queue: int, group: str) -> int:
        """Messages of ``queue`` that ``group`` has not finished, without a receiver."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Receivers must have been shut down first."""

    async def check_server(self) -> None:  # noqa: B027 - optional hook
        """Refuse a broker set up to delete messages (Redis: an eviction policy; Kafka: a
        compacted dead-letter topic) with a :class:`ConfigError` naming the setting (and
        what accepts the risk, where something does), and log a warning
        for one set up to lose them on a restart (Redis: no persistence) or after a
        while (Kafka: a dead-letter topic with a finite retention), which is not
        refused. One attempt: a broker that does not answer raises
        ``BrokerConnectionError`` (check again later). A daemon calls it at start; an
        adapter checks its eviction policy before its first publish too."""

    async def recheck_server(self) -> None:  # noqa: B027 - optional hook
        """What :meth:`check_server` refuses, looked at again while a daemon runs (every
        :data:`~conveyor.workers.daemon.SERVER_RECHECK_S`): a setting changed since the
        start is logged as an error, never silent, and the daemon goes on (stopping it
        would protect nothing the broker already keeps). Errors reaching the broker are
        the caller's to ignore: the next look tries again."""

    async def eviction_policy(self) -> str | None:
        """What the broker deletes when full, for ``conveyor status`` (Redis: its
        ``maxmemory-policy``); None where nothing is ever deleted to make room."""
        return None

    async def persistence(self) -> str | None:
        """What the broker keeps across a restart, for ``conveyor status`` (Redis:
        ``aof``, ``rdb``, ``none`` or ``unknown``); None where the broker's log is its
        store (Kafka) or it lives in the process (memory)."""
        return None

    async def store_problems(self, queues: Sequence[int], groups: Sequence[str], *,
                             every_app: bool = False) -> list[StoreProblem]:
        """Where the stores of ``queues`` and of the dead letters of apps ``groups`` are
        unfit, for ``conveyor status``, ``conveyor dlq`` and the console: a Redis key of
        another type where a stream belongs (the readers of the port read it as empty:
        no lag, no group, no letter), a Kafka topic of letters the broker compacts or
        keeps for a finite time or size.
        ``every_app``: also the stores every app shares, whether or not any app has a
        group yet (Kafka's letter topics; ``status`` without ``--app``). Empty where all
        is well."""
        return []

    async def entries_beyond(self, total: int) -> dict[int, int]:
        """Messages on queues ``total`` and on, per queue that holds any, for a daemon's
        start and ``conveyor status``: a producer with a larger ``[queues] total`` put
        them where no daemon of a config with ``total`` reads (Redis: the queue streams
        past it, every one up to the largest total a config may have, so the sum is
        the whole). Empty where none are, or where the adapter refuses such a layout
        instead (Kafka: a topic with more partitions than the total is a
        :class:`ConfigError`)."""
        return {}


BEYOND_NAMED = 8
"""How many of the queues past ``[queues] total`` that hold entries a warning names (the
rest it counts): a producer with a total of 4,096 fills thousands of them."""


def first_named(names: Sequence[str], what: str) -> str:
    """``names`` joined, the first :data:`BEYOND_NAMED` of them, then how many more
    ``what`` there are: one line, however many hold entries."""
    shown = ", ".join(names[:BEYOND_NAMED])
    more = len(names) - BEYOND_NAMED
    return f"{shown} and {more:,} more {what}" if more > 0 else shown


def open_receivers(receivers: Iterable[QueueReceiver], queues: Sequence[int],
                   group: str) -> dict[int, str]:
    """Which of ``queues`` these receivers still hold open for ``group`` (queue: holder):
    the part of :meth:`QueueAdapter.owners` every adapter can answer in-process."""
    held: dict[int, str] = {}
    for receiver in list(receivers):
        for queue in queues:
            if queue not in held and (holder := receiver.holder(queue, group)):
                held[queue] = holder
    return held
