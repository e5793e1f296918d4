"""The Redis Streams queue adapter: one stream per queue, one consumer group per app.

Publishing: one :data:`~conveyor.adapters.redis.scripts.ENQUEUE` call per chunk, the
entries written as :mod:`~conveyor.adapters.redis.codec` lays them out (the metadata as
fields beside the body, so ``redis-cli XADD`` can publish).

Receiving (:mod:`~conveyor.adapters.redis.receiver`): ``XREADGROUP ... COUNT <free slots>
BLOCK <poll timeout>``; acknowledging: ``XACK`` through a Lua script that first checks the
queue's lease still holds this receiver's fencing token. The ids travel as one
space-separated argument (the script splits them): packing one argument per id cost
redis-py ~0.5 µs per message. A receiver first claims (``XAUTOCLAIM``) every pending
entry of its group — a previous owner's unfinished work — and delivers those first.

Dead letters and groups are the adapter's facets (``adapter.dead_letters``,
``adapter.groups``): :mod:`~conveyor.adapters.redis.letters` and
:mod:`~conveyor.adapters.redis.groups`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters.redis import scripts as lua
from conveyor.adapters.redis.codec import (
    MAX_HEADERS,
    enqueue_args,
    publish_chunks,
    tokens_of_runs,
)
from conveyor.adapters.redis.connections import (
    ClusterClient,
    close,
    connect,
    key_types,
    mget,
    on_primary,
)
from conveyor.adapters.redis.errors import (
    CLUSTER_ERRORS,
    Caller,
    ClusterUnreachableError,
    wrong_type,
    wrong_type_line,
)
from conveyor.adapters.redis.eviction import EvictionGuard
from conveyor.adapters.redis.groups import RedisGroups, undelivered
from conveyor.adapters.redis.keys import Keys, check_name, stream_id, token_of
from conveyor.adapters.redis.letters import LETTERS_EFFECT, RedisDeadLetters
from conveyor.adapters.redis.persistence import PersistenceReader
from conveyor.adapters.redis.receiver import RedisReceiver
from conveyor.platform.adapter import (
    QueueAdapter,
    QueueReceiver,
    StoreProblem,
    first_named,
    open_receivers,
)
from conveyor.platform.config import Config, RedisConfig
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    PublishNotReplicated,
    PublishUncertain,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import MAX_QUEUES
from conveyor.platform.message import Message
from conveyor.platform.partial_publish import publish_failure
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.redis")

_COUNT_STEP = 10_000  # entries counted per script call: each call stays short

_QUEUE_EFFECT = ("no daemon reads the queue, a publish to it fails and status counts it "
                 "empty; rename or delete the key")


def _while_connecting(exc: BaseException) -> bool:
    """Whether redis-py raised ``exc`` while opening a connection, before any command
    went out ("Error 111 connecting to …", "Timeout connecting to server"). Read from
    the message, which redis-py words so for these two cases only: should that change,
    a publish that failed so reports PublishUncertain, the safe answer. A cluster whose
    slots could not be read (:class:`ClusterUnreachableError`) was sent nothing either."""
    if isinstance(exc, ClusterUnreachableError):
        return True
    return isinstance(exc, rex.ConnectionError | rex.TimeoutError) and "connecting to" in str(exc)


def _in_place(reply: Exception) -> bool:
    """Whether a script call's error reply is its chunk's own refusal (out of memory,
    a key of another type), which fails that chunk alone; other errors (a slot moved, a
    replica refusing writes) go to the caller, which retries or words them."""
    return isinstance(reply, rex.ResponseError) and not isinstance(
        reply, (rex.ReadOnlyError, *CLUSTER_ERRORS))


class _QueueSend:
    """One queue's share of a publishing round: its chunks and their script calls."""

    def __init__(self, queue: int, messages: Sequence[Message], keys: Keys,
                 window_ms: int) -> None:
        self.queue = queue
        self.messages = messages
        self.stream = keys.queue(queue)
        self.chunks = publish_chunks(messages)
        self.calls = [([self.stream, keys.published(queue, uuid.uuid4().hex)],
                       [window_ms, *enqueue_args(c)]) for c in self.chunks]
        self.what = f"publishing {len(messages)} messages to queue {queue}"


def _raw_reply(response: Any, **_options: Any) -> Any:
    """A stream reply as hiredis parsed it: redis-py would build a dict per entry, which
    costs time on reads and loses repeated fields (dead letters keep them all)."""
    return response


def _id_before(to: SequenceToken | float, queue: int) -> str:
    """The stream id just before a token or a UNIX time: where a rewind puts a group."""
    if isinstance(to, SequenceToken):
        ms, seq = to.major, to.minor
    else:
        ms, seq = int(to * 1000), 0
    if ms == 0 and seq == 0:
        return "0-0"
    return f"{ms}-{seq - 1}" if seq > 0 else f"{max(ms - 1, 0)}-18446744073709551615"


def _utc(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return "after the year 9999"


def _unpublished(to: SequenceToken | float) -> str:
    """The messages a group set just before ``to``, past the stream's end, skips."""
    if isinstance(to, SequenceToken):
        return (f"every message published until the stream's ids reach {to.major}-"
                f"{to.minor} ({_utc(to.major)} on the Redis server's clock)")
    return f"every message published until {_utc(int(to * 1000))} (on the Redis server's clock)"


class RedisAdapter(QueueAdapter):
    name = "redis"
    max_headers = MAX_HEADERS

    def __init__(self, cfg: RedisConfig, *, redis: aioredis.Redis | None = None,
                 max_dead_letters: int = 0, new_group_start: str = "earliest",
                 queues_total: int | None = None) -> None:
        self.cfg = cfg
        self.queues_total = queues_total
        """``[queues] total``, where known: :meth:`check_server` looks past it."""
        self.new_group_id = "$" if new_group_start == "latest" else "0"
        """Where ``XGROUP CREATE`` puts a new group: ``[queues] new_group_start``."""
        # Any: redis-py 8 types replies as unions of every protocol shape.
        self.redis: Any = redis if redis is not None else connect(cfg)
        self.cluster = isinstance(self.redis, ClusterClient)
        self.publishes_queues_together = not self.cluster  # one pipeline; a cluster's
        # queues live on different nodes: one send each (see enqueue_queues)
        self.keys = Keys(cfg.prefix, cluster=self.cluster)
        # Receivers decode XREADGROUP replies themselves (EntryDecoder), straight from
        # the lists hiredis built: redis-py's parser would add a dict per entry.
        self.redis.set_response_callback("XREADGROUP", _raw_reply)
        self.redis.set_response_callback("XRANGE", _raw_reply)
        self.caller = Caller(cfg, self.redis)
        self.ack_script = self.redis.register_script(lua.ACK)
        self.ack_fenced_script = self.redis.register_script(lua.ACK_FENCED)
        self.claim_script = self.redis.register_script(lua.CLAIM_ALL)
        self.strays_script = self.redis.register_script(lua.STRAYS)
        self.unread_deleted_script = self.redis.register_script(lua.UNREAD_DELETED)
        self.hand_back_script = self.redis.register_script(lua.HAND_BACK)
        self.trim_script = self.redis.register_script(lua.TRIM_ACKED)
        self.count_script = self.redis.register_script(lua.COUNT_RANGE)
        self.count_start_script = self.redis.register_script(lua.COUNT_START)
        self.added_script = self.redis.register_script(lua.STREAM_ADDED)
        self.tail_script = self.redis.register_script(lua.STREAM_TAIL)
        self.next_id_script = self.redis.register_script(lua.STREAM_NEXT)
        self.enqueue_script = self.redis.register_script(lua.ENQUEUE)
        self.min_replicas: int = cfg.min_replicas
        self.replica_timeout_ms: int = cfg.replica_timeout_ms
        self.replica_log = ThrottledLog(log, interval_s=30.0)
        self.publish_window_ms = int(2000 * (cfg.retry_max_s + cfg.socket_timeout_s))
        """How long a published batch's marker lives: past any retry of it (a retry
        starts within ``retry_max_s`` of the first attempt and waits at most
        ``socket_timeout_s`` for its reply), with a margin of as much again."""
        self.replayed_batches = 0
        """Batches a retry found already written (their first reply was lost)."""
        self._groups_ready: set[tuple[int, str]] = set()
        self.eviction = EvictionGuard(cfg, self.caller)
        self.persistence_reader = PersistenceReader(self.caller)
        # Receivers handed out and not yet shut down (weakly: a dropped one stops counting).
        self._receivers: weakref.WeakSet[RedisReceiver] = weakref.WeakSet()
        self.dead_letters = RedisDeadLetters(
            self.redis, self.caller, self.keys, cluster=self.cluster,
            max_entries=max_dead_letters, publish_window_ms=self.publish_window_ms)
        self.groups = RedisGroups(self.redis, self.caller, self.keys, self.count_after,
                                  self.stream_tail)

    async def check_server(self) -> None:
        """Its eviction policy (see :class:`~conveyor.adapters.redis.eviction.EvictionGuard`),
        then its persistence, reported, never refused (see
        :mod:`~conveyor.adapters.redis.persistence`)."""
        await self.eviction.check(retry=False)
        await self.persistence_reader.report()
        if self.queues_total is not None:
            stray = await self.entries_beyond(self.queues_total)
            if stray:
                names = first_named([f"{self.keys.queue(q)} ({n:,})" for q, n in stray.items()],
                                    "streams")
                log.warning(
                    "redis: queue streams past [queues] total = %d hold %s entries: %s. "
                    "Messages a producer publishes there, with a larger total, are read by "
                    "no daemon of this config: every producer and daemon of an app must "
                    "use the same total", self.queues_total, f"{sum(stray.values()):,}",
                    names)

    async def recheck_server(self) -> None:
        """The eviction policy and the persistence, again (:meth:`EvictionGuard.recheck`,
        :meth:`PersistenceReader.recheck`)."""
        await self.eviction.recheck()
        await self.persistence_reader.recheck()

    async def entries_beyond(self, total: int) -> dict[int, int]:
        """Entries in each queue stream from ``total`` to the largest any config may have
        (``MAX_QUEUES - 1``), where there are any: messages published with a larger
        ``[queues] total`` than ``total`` (the hash ring spreads a stream key over every
        queue of a total, so a larger one fills ``total`` itself and on). Every such
        stream, so the count is the whole: one ``XLEN`` each, in one pipeline (up to
        4,096; a few milliseconds of the server's time)."""
        queues = range(total, MAX_QUEUES)

        async def read() -> list[int]:
            pipe: Any
            async with self.redis.pipeline(transaction=False) as pipe:
                for q in queues:
                    pipe.xlen(self.keys.queue(q))
                lengths = await pipe.execute(raise_on_error=False)
            for n in lengths:  # a key of another type is no queue (WRONGTYPE): 0
                if isinstance(n, BaseException) and not isinstance(n, rex.ResponseError):
                    raise n
            return [n if isinstance(n, int) else 0 for n in lengths]

        lengths = await self.caller.retrying("reading the queues past [queues] total", read)
        return {q: int(n) for q, n in zip(queues, lengths, strict=True) if n}

    async def store_problems(self, queues: Sequence[int], groups: Sequence[str], *,
                             every_app: bool = False) -> list[StoreProblem]:
        """The keys of ``queues``' streams and of ``groups``' dead letters that hold
        another type (``SET PREFIX:q:3 x``): a daemon backs off on such a queue, a
        publish to it fails and the readers here read it as empty; one ``TYPE`` each, in
        one pipeline. (``every_app`` adds nothing: each app's letters have a key of
        their own, checked where ``groups`` names the app.)"""
        stores = [(self.keys.queue(q), f"queue {q}", _QUEUE_EFFECT) for q in queues]
        stores += [(self.keys.dead_letters(g), f"app {g!r}'s dead letters", LETTERS_EFFECT)
                   for g in groups]
        found = await self.caller.retrying(
            "reading the types of the queue and dead-letter keys",
            lambda: key_types(self.redis, [key for key, _, _ in stores]))
        return [StoreProblem(key, holds, kind,
                             wrong_type_line(key, holds, kind, "stream", effect))
                for (key, holds, effect), kind in zip(stores, found, strict=True)
                if kind not in ("stream", "none")]

    async def eviction_policy(self) -> str | None:
        return await self.eviction.summary()

    async def persistence(self) -> str | None:
        return await self.persistence_reader.summary()

    async def ensure_group(self, queue: int, group: str, *, again: bool = False) -> None:
        """Create ``group`` on the queue's stream where ``[queues] new_group_start`` says:
        at its start (every retained entry) or its end (what is added from now on).
        ``again``: the group existed and was deleted under its reader (``NOGROUP``), so
        the app is not new: at the start whatever the setting, since its end would skip
        what was published and not yet read (and after a ``DEL``, what was published
        since)."""
        stream = self.keys.queue(queue)
        start = "0" if again else self.new_group_id

        async def create() -> None:
            try:
                await self.redis.xgroup_create(stream, check_name(group, "app name"),
                                               start, mkstream=True)
            except rex.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        await self.caller.retrying(f"creating group {group!r} on queue {queue}", create)
        self._groups_ready.add((queue, group))

    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        """Append in order, each message once, however often the call is retried.

        One :data:`~conveyor.adapters.redis.scripts.ENQUEUE` call per chunk (one round
        trip for all of them), each under a batch id of its own: a retry after a cut
        connection re-sends the same ids, and a chunk the server had already written is
        not written again (its marker lives ``publish_window_ms``). When the retries run
        out, whether the messages landed is unknown: :class:`PublishUncertain` — unless
        no attempt got past opening a connection (:class:`BrokerConnectionError`: none
        was sent). A chunk the server refuses (out of memory under ``noeviction``) is
        written not at all (a script that has not written yet stops at its first write);
        when others were written, :class:`PartialPublishError` says which.
        """
        if not messages:
            return []
        outcome = (await self.enqueue_queues({queue: messages}))[queue]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def enqueue_queues(
        self, batches: Mapping[int, Sequence[Message]]
    ) -> dict[int, list[SequenceToken] | Exception]:
        """:meth:`enqueue` of several queues in one round trip: one pipeline of every
        queue's script calls (and one ``WAIT`` after them all with ``min_replicas``),
        retried as a whole — each chunk under its own batch id, so a retry writes none
        twice. Each queue gets what :meth:`enqueue` of it alone would have given: its
        tokens, or its error (a chunk refused in place fails its own queue only). On a
        cluster, where queues live on different nodes, one :meth:`enqueue` per queue,
        concurrently."""
        out: dict[int, list[SequenceToken] | Exception] = {
            q: [] for q, messages in batches.items() if not messages}
        batches = {q: messages for q, messages in batches.items() if messages}
        if not batches:
            return out
        if self.cluster and len(batches) > 1:
            return out | await super().enqueue_queues(batches)
        if not self.eviction.checked:  # before the first: a server that may evict refuses
            await self.eviction.check(retry=True)
        window = self.publish_window_ms
        sends = [_QueueSend(q, messages, self.keys, window) for q, messages in batches.items()]
        calls = [call for send in sends for call in send.calls]
        script = self.enqueue_script
        reached = False  # whether some attempt may have got its request to the server
        replicas = self.min_replicas

        async def pipelined(client: aioredis.Redis) -> list[Any]:
            nonlocal reached
            pipe: Any
            # ``async with``: a failure before execute's own clean-up would otherwise
            # leave the connection checked out of the pool.
            async with client.pipeline(transaction=False) as pipe:
                # The script loaded first, in the same round trip: a server that does not
                # know it (new, restarted, flushed, failed over) would refuse some chunks
                # and, with the script loaded by another client meanwhile, store later
                # ones — a queue's order broken. Its reply (the sha) is left out.
                pipe.script_load(script.script)
                for keys, args in calls:
                    pipe.evalsha(script.sha, 2, *keys, *args)
                if replicas:  # on the same connection as the writes, as WAIT requires
                    pipe.execute_command("WAIT", replicas, self.replica_timeout_ms)
                # Errors in place: a chunk refused must not hide the ones written.
                replies: list[Any] = (await pipe.execute(raise_on_error=False))[1:]
            reached = True  # the requests went out, whatever fails from here
            for reply in replies:
                if isinstance(reply, Exception) and not _in_place(reply):
                    raise reply  # worth a retry (a slot moved), or a refusal to word
            return replies

        async def send() -> list[Any]:
            nonlocal reached
            try:
                if len(calls) == 1 and not replicas:
                    keys, args = calls[0]
                    return [await script(keys=keys, args=args)]
                return await on_primary(self.redis, sends[0].stream, pipelined)
            except BaseException as exc:
                reached = reached or not _while_connecting(exc)
                raise

        what = sends[0].what if len(sends) == 1 else (
            f"publishing {sum(len(m) for m in batches.values())} messages to "
            f"{len(sends)} queues")
        try:
            replies = await self.caller.retrying(what, send)
        except BrokerConnectionError as exc:
            if not reached:  # every attempt failed to connect: nothing was sent
                raise
            for s in sends:
                unsure = PublishUncertain(
                    f"redis: {s.what}: the connection failed and retries ran out after "
                    f"{self.caller.retry_max_s:g}s ($.redis.retry_max_s): the messages may "
                    f"or may not have been written ({exc}); their ids are in .message_ids",
                    tuple(m.id for m in s.messages))
                unsure.__cause__ = exc
                out[s.queue] = unsure
            return out
        confirmed = int(replies.pop()) if replicas else 0
        at = 0
        for s in sends:
            out[s.queue] = self._outcome(s, replies[at: at + len(s.calls)], confirmed)
            at += len(s.calls)
        return out

    def _outcome(self, send: _QueueSend, replies: Sequence[Any],
                 confirmed: int) -> list[SequenceToken] | Exception:
        """One queue's tokens from its chunks' replies, or its error."""
        what, replicas = send.what, self.min_replicas
        tokens: list[SequenceToken] = []
        published: dict[str, SequenceToken] = {}
        failures: list[tuple[list[str], BaseException]] = []
        for chunk, reply in zip(send.chunks, replies, strict=True):
            if isinstance(reply, Exception):  # refused whole: see ENQUEUE
                failures.append(([m.id for m in chunk],
                                 BrokerError(f"redis error while {what}: {reply}")))
                continue
            runs, replayed = reply
            if replayed:
                self.replayed_batches += 1
            chunk_tokens = tokens_of_runs(runs, send.queue)
            published.update(zip((m.id for m in chunk), chunk_tokens, strict=True))
            tokens += chunk_tokens
        if replicas and confirmed < replicas:
            unsure = PublishNotReplicated(
                f"redis: {what}: written to the primary, but {confirmed} of the "
                f"{replicas} replicas $.redis.min_replicas asks for confirmed it within "
                f"{self.replica_timeout_ms} ms ($.redis.replica_timeout_ms); a failover "
                "now could lose the messages; their ids are in .message_ids",
                tuple(published))
            failures.append((list(published), unsure))
            published = {}
        if failures:
            error = publish_failure(f"redis: {what}", [m.id for m in send.messages],
                                    published, failures)
            assert isinstance(error, Exception)
            return error
        return tokens

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = RedisReceiver(self, queue, group)
        self._receivers.add(receiver)
        return receiver

    async def forward_gap(self, queue: int, group: str, to: SequenceToken | float) -> int:
        """Entries the group was never given between its last delivered id and ``to``.

        Its pending entries are not counted: a rewind leaves them pending, and they are
        claimed and delivered as before.
        """
        stream = self.keys.queue(queue)
        before = _id_before(to, queue)

        async def count() -> int:
            if not await self.redis.exists(stream):
                return 0
            last: bytes | str = "0-0"  # a group created later starts at the beginning
            for g in await self.redis.xinfo_groups(stream):
                if g["name"].decode() == group:
                    last = g["last-delivered-id"]
            return await self.count_after(stream, last, before)

        return await self.caller.retrying(f"reading {group!r}'s position on queue {queue}", count)

    async def skips_unpublished(self, queue: int, to: SequenceToken | float) -> str | None:
        """``XADD *`` gives an entry an id above the stream's last generated one and at
        least the server's clock in ms: a group set at or past that next id (just before
        ``to``) is given none of the entries published until the ids pass it. Read in one
        script on the stream's node, whose clock is the one that counts."""
        stream = self.keys.queue(queue)
        before = stream_id(_id_before(to, queue))
        last, secs, micros = await self.caller.retrying(
            f"reading the end of queue {queue}", lambda: self.next_id_script(keys=[stream]))
        now_ms = int(secs) * 1000 + int(micros) // 1000
        if before <= stream_id(last) or before[0] < now_ms:
            return None
        return _unpublished(to)

    async def owners(self, queues: Sequence[int], group: str) -> dict[int, str]:
        """The queues' lease keys (daemons on any machine, under the dynamic balancer),
        then this adapter's open receivers. A receiver run without a lease in another
        process (the static balancer, a hand-made receiver) is not seen."""
        if not queues:
            return {}
        keys = [self.keys.lease(group, q) for q in queues]
        values = await self.caller.retrying("reading the leases", lambda: mget(self.redis, keys))
        leased = {q: v.decode().partition(" ")[2] for q, v in zip(queues, values, strict=True)
                  if v is not None}
        return {**open_receivers(self._receivers, queues, group), **leased}

    async def rewind(self, queue: int, group: str, to: SequenceToken | float) -> None:
        """``XGROUP SETID`` to just before the target."""
        stream = self.keys.queue(queue)
        before = _id_before(to, queue)
        if isinstance(to, SequenceToken):
            await self._check_not_trimmed(stream, queue, to)
        await self.ensure_group(queue, group)
        # Tell Redis how many entries the group has now read (ENTRIESREAD), so that
        # XINFO keeps reporting its lag: without it, Redis cannot tell after a rewind
        # into the middle of the stream. Entries added meanwhile come after the
        # snapshot's last id, so they change neither side of the subtraction.
        added, last = await self.caller.retrying(
            "reading the stream", lambda: self.added_script(keys=[stream])
        )
        entries_read: int | None = None  # Redis < 7 keeps no such count
        if int(added) >= 0:
            after = await self.caller.retrying(
                "counting entries", lambda: self.count_after(stream, before, last)
            )
            entries_read = max(int(added) - after, 0)
        await self.caller.retrying(
            f"rewinding {group!r} on queue {queue}",
            lambda: self.redis.xgroup_setid(stream, group, before, entries_read=entries_read),
        )

    async def _check_not_trimmed(self, stream: str, queue: int, to: SequenceToken) -> None:
        """Refuse a token older than the oldest entry only if entries were removed.

        A token before the stream's first entry is fine when the stream never lost an
        entry (the rewind then starts at the beginning): Redis 7 counts the entries ever
        added, and ``entries-added == length`` says none was trimmed or deleted. Older
        Redis keeps no such count, so it is refused there, saying so.
        """
        first = await self.caller.retrying(
            "reading the queue", lambda: self.redis.xrange(stream, "-", "+", count=1)
        )
        if not first or token_of(first[0][0], queue) <= to:
            return
        oldest = token_of(first[0][0], queue)
        info = await self.caller.retrying("reading the queue",
                                          lambda: self.redis.xinfo_stream(stream))
        added = info.get("entries-added")
        if added is None:
            raise BrokerError(
                f"queue {queue}: {to} is older than the oldest entry kept ({oldest}) and this "
                "Redis (< 7) cannot tell whether entries were trimmed since; rewind to "
                f"{oldest} to replay what is kept"
            )
        removed = int(added) - int(info["length"])
        if removed > 0:
            raise BrokerError(
                f"queue {queue}: {to} is older than the oldest entry kept ({oldest}): "
                f"{removed} entr{'y' if removed == 1 else 'ies'} were trimmed or deleted; "
                f"rewind to {oldest} to replay what is kept, or raise $.redis.retention_s "
                "to keep more"
            )

    async def stream_tail(self, stream: str) -> bytes | None:
        """The id of ``stream``'s last entry (``b"0-0"`` when it has none); None where no
        stream is: no key, or a key of another type."""
        reply = await self.tail_script(keys=[stream])
        return bytes(reply[1]) if len(reply) > 1 else None

    async def count_after(self, stream: str, first: bytes | str, last: bytes | str) -> int:
        """Entries in ``(first, last]``, counted on the server in bounded steps.

        Not retried here (callers retry the whole count): only counts cross the wire.
        """
        total = 0
        while True:
            n, upto = await self.count_script(keys=[stream], args=[first, last, _COUNT_STEP])
            total += int(n)
            if int(n) < _COUNT_STEP:
                return total
            first = upto

    async def lag(self, queue: int, group: str) -> int:
        """Entries not yet delivered to ``group`` plus those delivered but not acked; 0
        on a key of another type (:meth:`store_problems` names it)."""
        stream = self.keys.queue(queue)

        async def read() -> int:
            tail = await self.stream_tail(stream)
            if tail is None:  # no stream, nothing to read (store_problems names a key
                return 0  # of another type)
            try:
                groups = await self.redis.xinfo_groups(stream)
            except rex.ResponseError as exc:
                if wrong_type(exc):  # replaced meanwhile
                    return 0
                raise
            for g in groups:
                if g["name"].decode() != group:
                    continue
                unread = undelivered(g, tail)
                if unread is None:  # Redis cannot tell (after deletions): count
                    unread = await self.count_after(stream, g["last-delivered-id"], "+")
                return int(g["pending"]) + unread
            return int(await self.redis.xlen(stream))  # a new group would read everything

        return await self.caller.retrying(f"reading the lag of queue {queue}", read)

    async def close(self) -> None:
        await close(self.redis)


def from_config(config: Config) -> RedisAdapter:
    return RedisAdapter(config.redis, max_dead_letters=config.dead_letters.max_entries,
                        new_group_start=config.queues.new_group_start,
                        queues_total=config.queues.total)


async def wait_ready(adapter: RedisAdapter, timeout_s: float = 10.0) -> None:
    """Wait until the server answers PING (tools and tests)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await adapter.redis.ping()
            return
        except (rex.ConnectionError, rex.TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
