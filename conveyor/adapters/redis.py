"""The Redis Streams queue adapter: one stream per queue, one consumer group per app.

Wire format: every entry carries the message's metadata as fields beside the body
(``cv-ns``, ``cv-key``, ``cv-id``, ``content-type``, ``cv-ts``, ``cv-attempt``,
``body``; any other field is a user header), so ``redis-cli XADD`` can publish.

Receiving: ``XREADGROUP ... COUNT <free slots> BLOCK <poll timeout>``; acknowledging:
``XACK`` through a Lua script that first checks the queue's lease still holds this
receiver's fencing token. The ids travel as one space-separated argument (the script
splits them): packing one argument per id cost redis-py ~0.5 µs per message.

A receiver first claims (``XAUTOCLAIM``) every pending entry of its group — a previous
owner's unfinished work — and delivers those first.

A read whose reply is lost (connection dropped, server restarting) has left entries
in this consumer's pending list; the next read re-reads that list from the last entry
delivered, so nothing is stranded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters import redis_letters
from conveyor.adapters import redis_scripts as lua
from conveyor.adapters.redis_conn import (
    CLUSTER_ERRORS,
    Caller,
    ClusterClient,
    Keys,
    check_name,
    close,
    connect,
    joined_ids,
    mget,
    on_primary,
    run_replicated,
    token_of,
)
from conveyor.adapters.redis_coordination import lease_held
from conveyor.adapters.redis_eviction import EvictionGuard
from conveyor.platform import letters as layout
from conveyor.platform.adapter import QueueAdapter, QueueReceiver, open_receivers
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    DecodeError,
    LeaseLostError,
    PublishNotReplicated,
    PublishUncertain,
)
from conveyor.platform.groups import GroupInfo
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.leases import Lease
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import (
    CONTENT_BYTES,
    CONTENT_JSON,
    H_ATTEMPT,
    H_CONTENT_TYPE,
    H_ENQUEUED_MS,
    H_ID,
    H_KEY,
    H_NAMESPACE,
    DeadLetter,
    Message,
    Undecodable,
    now_ms,
)
from conveyor.platform.partial_publish import publish_failure
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.redis")

F_BODY = "body"
_NS, _KEY, _ID, _CT, _TS, _ATT, _BODY = (
    f.encode() for f in (H_NAMESPACE, H_KEY, H_ID, H_CONTENT_TYPE, H_ENQUEUED_MS, H_ATTEMPT,
                         F_BODY)
)
_KNOWN = frozenset({_NS, _KEY, _ID, _CT, _TS, _ATT, _BODY})
# Header names that would be read back as metadata (or the body), not as headers.
_RESERVED = frozenset(f.decode() for f in _KNOWN)
# The field order encode_fields writes: entries in it decode without building a dict.
_LAYOUT = [_NS, _KEY, _ID, _CT, _TS, _BODY]
_LAYOUT_LEN = 2 * len(_LAYOUT)
_INTERN_MAX = 4096  # distinct streams / content types remembered per receiver
_ACK_CHUNK = 4000  # ids per script call (Lua's unpack limit is ~8000)
_COUNT_STEP = 10_000  # entries counted per script call: each call stays short
PUBLISH_CHUNK = 1000
"""Entries per publishing script call at most (one call runs ~1 ms with small bodies)."""
PUBLISH_CHUNK_BYTES = 4 << 20
"""Body bytes per publishing script call, about (a call with one larger body goes alone)."""
_decode_legacy_letter = msgspec.msgpack.Decoder(DeadLetter).decode


def extra_fields(msg: Message) -> list[bytes | str]:
    """The fields after the fixed ones: ``cv-attempt`` if set, then the user's headers."""
    extra: list[bytes | str] = [_ATT, b"%d" % msg.attempt] if msg.attempt else []
    for name, value in msg.headers.items():
        if name in _RESERVED:
            raise BrokerError(
                f"message {msg.id}: header {name!r} is reserved by the Redis wire format "
                f"(reserved: {', '.join(sorted(_RESERVED))}); rename the header"
            )
        extra += (name, value)
    return extra


def encode_fields(msg: Message) -> dict[bytes | str, bytes | str]:
    """The stream fields of one message (see the module docstring), in the order
    :class:`EntryDecoder` reads fastest."""
    fields: dict[bytes | str, bytes | str] = {
        _NS: msg.stream.namespace,
        _KEY: msg.stream.key,
        _ID: msg.id,
        _CT: msg.content_type,
        _TS: b"%d" % (msg.enqueued_at_ms or now_ms()),
        _BODY: msg.body,
    }
    extra = extra_fields(msg)
    fields.update(zip(extra[0::2], extra[1::2], strict=True))
    return fields


def enqueue_args(messages: Sequence[Message]) -> list[bytes | str | int]:
    """The entries as :data:`~conveyor.adapters.redis_scripts.ENQUEUE` reads them (after
    its first argument): per message its extra fields' count, the six metadata values in
    :func:`encode_fields`' order (the script supplies their names), the extra fields."""
    args: list[bytes | str | int] = []
    for msg in messages:
        extra = extra_fields(msg) if msg.attempt or msg.headers else []
        stream = msg.stream
        args += (len(extra), stream.namespace, stream.key, msg.id, msg.content_type,
                 msg.enqueued_at_ms or now_ms(), msg.body)
        if extra:
            args += extra
    return args


def publish_chunks(messages: Sequence[Message]) -> list[Sequence[Message]]:
    """``messages`` cut into script calls of at most :data:`PUBLISH_CHUNK` entries and
    about :data:`PUBLISH_CHUNK_BYTES` of bodies (a script blocks the server while it
    runs, and Redis caps one argument at 512 MB)."""
    if len(messages) <= PUBLISH_CHUNK and sum(
        [len(m.body) for m in messages]
    ) <= PUBLISH_CHUNK_BYTES:
        return [messages]
    chunks: list[Sequence[Message]] = []
    start, size = 0, 0
    for i, msg in enumerate(messages):
        if i > start and (i - start >= PUBLISH_CHUNK or size + len(msg.body) > PUBLISH_CHUNK_BYTES):
            chunks.append(messages[start:i])
            start, size = i, 0
        size += len(msg.body)
    if start < len(messages):
        chunks.append(messages[start:])
    return chunks


def _while_connecting(exc: BaseException) -> bool:
    """Whether redis-py raised ``exc`` while opening a connection, before any command
    went out ("Error 111 connecting to …", "Timeout connecting to server"). Read from
    the message, which redis-py words so for these two cases only: should that change,
    a publish that failed so reports PublishUncertain, the safe answer."""
    return isinstance(exc, rex.ConnectionError | rex.TimeoutError) and "connecting to" in str(exc)


def tokens_of_runs(runs: bytes, queue: int) -> list[SequenceToken]:
    """The entry ids :data:`~conveyor.adapters.redis_scripts.ENQUEUE` returns as runs
    (``MS-SEQ COUNT ...``), one token each."""
    words = runs.split()
    tokens: list[SequenceToken] = []
    for first, count in zip(words[0::2], words[1::2], strict=True):
        start = token_of(first, queue)
        tokens += (SequenceToken(queue, start.major, start.minor + k) for k in range(int(count)))
    return tokens


TS_MAX = 2**63 - 1
ATTEMPT_MAX = 2**31 - 1


def wire_number(raw: bytes, field: str, limit: int) -> int:
    """A number field as the wire format writes it: ASCII digits, at most ``limit``.

    Stricter than ``int()``, which takes signs, spaces, underscores and other scripts'
    digits: a value that would not survive a round trip is a malformed entry.
    """
    if not raw.isdigit() or len(raw) > 19 or int(raw) > limit:
        raise DecodeError(f"{field} is not a whole number from 0 to {limit}: {raw[:40]!r}")
    return int(raw)


def decode_entry(queue: int, eid: bytes, fields: dict[bytes, bytes]) -> Message:
    """A message from a stream entry (raises on malformed metadata: see EntryDecoder).

    Missing optional metadata gets neutral defaults; ``cv-ns`` is required.
    """
    get = fields.get
    token = token_of(eid, queue)
    ns = get(_NS)
    if not ns:
        raise DecodeError("no cv-ns field (the namespace that selects the handlers)")
    headers = {k.decode(): v.decode() for k, v in fields.items() if k not in _KNOWN}
    ts = get(_TS)
    att = get(_ATT)
    ident = get(_ID)
    ctype = get(_CT)
    return Message(
        id=ident.decode() if ident else eid.decode(),
        stream=StreamId(ns.decode(), (get(_KEY) or b"").decode()),
        body=get(_BODY) or b"",
        headers=headers,
        content_type=ctype.decode() if ctype else CONTENT_JSON,
        attempt=wire_number(att, H_ATTEMPT, ATTEMPT_MAX) if att else 0,
        enqueued_at_ms=wire_number(ts, H_ENQUEUED_MS, TS_MAX) if ts else token.major,
        token=token,
    )


def undecodable_entry(queue: int, eid: bytes, fl: list[bytes], exc: Exception) -> Undecodable:
    """What a receiver delivers for an entry it cannot read: every field, byte for byte."""
    raw = tuple(zip(fl[0::2], fl[1::2], strict=False))
    body = next((value for name, value in raw if name == _BODY), b"")
    token = token_of(eid, queue)
    return Undecodable(
        id=eid.decode(), stream=StreamId("", ""), body=body, content_type=CONTENT_BYTES,
        enqueued_at_ms=token.major, token=token,
        reason=f"{type(exc).__name__}: {exc}", raw_fields=raw,
    )


def letter_entry(letter: DeadLetter, app: str) -> list[bytes | str]:
    """A dead letter's stream fields: ``cv-dl-*`` first, then the message's own fields
    (an undecodable one's byte for byte); see conveyor.platform.letters."""
    flat: list[bytes | str] = [x for pair in layout.meta_pairs(letter, app) for x in pair]
    msg = letter.message
    if isinstance(msg, Undecodable) and letter.form == "full":
        for name, value in msg.raw_fields:
            flat += (name, value if value is not None else b"")
    else:
        flat += [x for pair in encode_fields(msg).items() for x in pair]
    return flat


def letter_from_entry(fl: list[bytes]) -> DeadLetter | None:
    """A stored dead letter read back; None for an entry that is not one."""
    names = fl[0::2]
    if layout.is_letter(names):
        count = layout.meta_count(fl[1])
        values = fl[1 : 2 * count : 2]
        token = SequenceToken.parse(values[7].decode()) if values[7] else SequenceToken(0, 0)
        eid = b"%d-%d" % (token.major, token.minor)
        message = EntryDecoder(token.queue).decode(eid, fl[2 * count :])
        return layout.letter_from_meta(values, message)
    if b"letter" in names:  # stored by Conveyor 0.1 (one msgpack field)
        return _decode_legacy_letter(fl[2 * names.index(b"letter") + 1])
    return None


def stored_letters(entries: list[Any]) -> list[StoredLetter]:
    """The letters of a dead-letter stream's entries, under their entry ids."""
    out = []
    for eid, fields in entries:
        letter = letter_from_entry(fields) if fields else None
        if letter is not None:
            out.append(StoredLetter(eid.decode(), letter))
    return out


def _raw_reply(response: Any, **_options: Any) -> Any:
    """A stream reply as hiredis parsed it: redis-py would build a dict per entry, which
    costs time on reads and loses repeated fields (dead letters keep them all)."""
    return response


class EntryDecoder:
    """Turns raw entries (``[id, [field, value, ...]]``) of one queue into messages.

    Same result as :func:`decode_entry` on the entry's field dict, except that an entry
    whose metadata cannot be read becomes an :class:`Undecodable` (with its raw fields
    and the reason) instead of an exception: one bad entry never fails the batch it came
    with. Entries laid out as
    :func:`encode_fields` writes them are read by position; stream ids and content
    types are interned, so a batch of one stream's messages shares one
    :class:`StreamId` (and the cache's lane lookups compare it by identity).
    """

    __slots__ = ("_queue", "_streams", "_types")

    def __init__(self, queue: int) -> None:
        self._queue = queue
        self._streams: dict[tuple[bytes, bytes], StreamId] = {}
        self._types: dict[bytes, str] = {CONTENT_JSON.encode(): CONTENT_JSON}

    def _stream(self, ns: bytes, key: bytes) -> StreamId:
        streams = self._streams
        if len(streams) >= _INTERN_MAX:
            streams.clear()
        sid = streams[(ns, key)] = StreamId(ns.decode(), key.decode())
        return sid

    def _type(self, ctype: bytes) -> str:
        types = self._types
        if len(types) >= _INTERN_MAX:
            types.clear()
        text = types[ctype] = ctype.decode()
        return text

    def decode(self, eid: bytes, fl: list[bytes]) -> Message:
        try:
            if len(fl) < _LAYOUT_LEN or fl[0:_LAYOUT_LEN:2] != _LAYOUT:
                return self._general(eid, fl)
            att = b""
            headers: dict[str, str] = {}
            if len(fl) > _LAYOUT_LEN:
                for i in range(_LAYOUT_LEN, len(fl) - 1, 2):
                    name = fl[i]
                    if name == _ATT:
                        att = fl[i + 1]
                    elif name in _KNOWN:  # a repeated field: the dict's last-wins rules
                        return self._general(eid, fl)
                    else:
                        headers[name.decode()] = fl[i + 1].decode()
            ns, key, ident, ctype, ts = fl[1], fl[3], fl[5], fl[7], fl[9]
            if not ns or att or not (ts.isdigit() and len(ts) < 19):
                # Rare here (a retried message, a hand-written entry): the strict path.
                return self._general(eid, fl)
            stream = self._streams.get((ns, key)) or self._stream(ns, key)
            ms, _, seq = eid.partition(b"-")
            major = int(ms)
            return Message(
                ident.decode() if ident else eid.decode(),
                stream,
                fl[11],
                headers,
                (self._types.get(ctype) or self._type(ctype)) if ctype else CONTENT_JSON,
                0,
                int(ts),  # ASCII digits, fewer than 19: within TS_MAX
                SequenceToken(self._queue, major, int(seq or 0)),
            )
        except Exception as exc:  # malformed metadata, whatever the failure: isolate it
            return undecodable_entry(self._queue, eid, fl, exc)

    def _general(self, eid: bytes, fl: list[bytes]) -> Message:
        it = iter(fl)
        return decode_entry(self._queue, eid, dict(zip(it, it, strict=False)))


def _id_before(to: SequenceToken | float, queue: int) -> str:
    """The stream id just before a token or a UNIX time: where a rewind puts a group."""
    if isinstance(to, SequenceToken):
        ms, seq = to.major, to.minor
    else:
        ms, seq = int(to * 1000), 0
    if ms == 0 and seq == 0:
        return "0-0"
    return f"{ms}-{seq - 1}" if seq > 0 else f"{max(ms - 1, 0)}-18446744073709551615"


def _default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class RedisReceiver(QueueReceiver):
    """One queue for one group. Not shared between tasks: one agent drives it."""

    def __init__(self, adapter: RedisAdapter, queue: int, group: str) -> None:
        cfg = adapter.cfg
        self._adapter = adapter
        self._redis = adapter.redis
        self._caller = adapter.caller
        self._queue = queue
        self._group = check_name(group, "app name")
        self._stream = adapter.keys.queue(queue)
        self._lease_key = adapter.keys.lease(group, queue)
        self._fenced_key = adapter.keys.fenced_acks(group, queue)
        self._consumer = _default_consumer()
        self._lease_value = ""
        self._token = 0
        # None: read new entries ('>'); otherwise re-read our pending list after this id.
        self._history_from: bytes | None = b"0-0"
        self._last_id = b"0-0"
        self._claim_batch = cfg.claim_batch
        self._retention_ms = int(cfg.retention_s * 1000)
        self._trim_interval_s = cfg.trim_interval_s
        self._next_trim = 0.0
        self._closed = False
        self._decoder = EntryDecoder(queue)
        self._check_lease = False
        """Set by what says the server may have lost the lease (a connection error: it
        may have restarted empty; a refused ack): the next read first checks it."""

    def set_lease(self, lease: Lease | None) -> None:
        if lease is None:
            self._lease_value, self._token = "", 0
            return
        self._consumer = lease.owner
        self._lease_value = f"{lease.token} {lease.owner}"
        self._token = lease.token

    async def initialize(self) -> None:
        adapter = self._adapter
        await adapter.ensure_group(self._queue, self._group)
        claimed, confirmed = await self._caller.retrying(
            f"claiming pending entries of queue {self._queue}",
            lambda: run_replicated(
                self._redis, adapter.claim_script, [self._stream, self._lease_key],
                [self._group, self._consumer, self._lease_value, self._claim_batch],
                adapter.min_replicas, adapter.replica_timeout_ms),
        )
        if claimed == -1:
            raise LeaseLostError(f"queue {self._queue}: lease lost before it could be claimed")
        if confirmed < adapter.min_replicas:
            # Started anyway, a failover could take the claim back: the entries would be
            # pending for the previous owner again, which reads this queue no more, and
            # no one would claim them until the queue next changes hands.
            raise BrokerConnectionError(
                f"queue {self._queue}: the claim of the previous owner's pending entries "
                f"reached {confirmed} of {adapter.min_replicas} replicas within "
                f"{adapter.replica_timeout_ms} ms ($.redis.min_replicas); not started")
        if claimed:
            log.info("queue %d: claimed %d pending entr%s of the previous owner",
                     self._queue, claimed, "y" if claimed == 1 else "ies")
        self._history_from = b"0-0"
        self._last_id = b"0-0"
        self._next_trim = time.monotonic() + self._trim_interval_s
        self._closed = False

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        if self._check_lease:
            await self._lease_held()
        if self._history_from is not None:
            out = await self._read(self._history_from, max_count, None)
            if out:
                return out
            self._history_from = None
        block = max(1, int(timeout_s * 1000)) if timeout_s > 0 else None
        return await self._read(b">", max_count, block)

    async def _read(self, start: bytes, count: int, block_ms: int | None) -> list[Message]:
        args: list[Any] = ["XREADGROUP", "GROUP", self._group, self._consumer, "COUNT", count]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        args += ["STREAMS", self._stream, start]
        try:
            # The adapter's client returns this reply unparsed (see _raw_reply).
            reply = await self._caller.once(
                f"reading queue {self._queue}", lambda: self._redis.execute_command(*args)
            )
        except BrokerConnectionError:
            # The reply may be lost while the server moved entries into our pending list.
            self._history_from = self._last_id
            self._check_lease = True
            raise
        except BrokerError as exc:
            if "NOGROUP" in str(exc):  # the stream or group was deleted: recreate, go on
                await self._lease_held()  # unless the lease went with it (an empty restart)
                await self._adapter.ensure_group(self._queue, self._group)
                return []
            raise
        if not reply:
            return []
        # RESP2: [[stream, entries]]; RESP3: {stream: entries}.
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        if not entries:
            return []
        last = entries[-1][0]
        self._last_id = last
        if start != b">":
            self._history_from = last
        decode = self._decoder.decode
        out = [decode(eid, fields) for eid, fields in entries if fields]
        if start != b">" and out:
            out = await self._with_deliveries(out, entries[0][0], last, len(entries))
        if len(out) < len(entries):  # pending, but trimmed or deleted meanwhile: ack them
            queue = self._queue
            await self.messages_delivered(
                [token_of(eid, queue) for eid, fields in entries if not fields]
            )
        return out

    async def _with_deliveries(self, out: list[Message], first: bytes, last: bytes,
                               count: int) -> list[Message]:
        """Entries re-read from this consumer's pending list (after a take-over, or a
        lost reply) with the delivery count Redis keeps for each (``XPENDING``): the
        claim moves entries with ``JUSTID``, which counts nothing, and each re-read
        counts one. Entries read new (``>``) are on their first delivery: no call."""
        reply = await self._caller.once(
            f"reading delivery counts on queue {self._queue}",
            lambda: self._redis.xpending_range(
                self._stream, self._group, first, last, count, self._consumer),
        )
        counts: dict[str, int] = {}
        for row in reply or ():
            if isinstance(row, dict):
                eid, n = row["message_id"], row["times_delivered"]
            else:
                eid, n = row[0], row[3]
            counts[eid.decode() if isinstance(eid, bytes) else str(eid)] = int(n)
        replace = msgspec.structs.replace
        marked = []
        for m in out:
            n = counts.get(f"{m.token.major}-{m.token.minor}", 1) if m.token else 1
            marked.append(m if n <= 1 else replace(m, deliveries=n))
        return marked

    async def handed_back(self, tokens: Sequence[SequenceToken], *,
                          all_unfinished: bool = False) -> None:
        """``XCLAIM ... RETRYCOUNT 0 JUSTID``: the next owner's read of its pending
        list then counts them as first deliveries again."""
        for i in range(0, len(tokens), _ACK_CHUNK):
            ids = [f"{t.major}-{t.minor}" for t in tokens[i:i + _ACK_CHUNK]]
            await self._caller.once(
                f"handing back unstarted messages of queue {self._queue}",
                lambda ids=ids: self._redis.xclaim(  # type: ignore[misc]
                    self._stream, self._group, self._consumer, 0, ids, retrycount=0,
                    justid=True))

    async def count_start(self, msg: Message) -> int:
        """``HINCRBY`` of the message's field in the queue's start counts (a hash beside
        the stream, same hash slot, kept as long as entries are: ``retention_s``)."""
        assert msg.token is not None
        key = f"{self._adapter.keys.prefix}:starts:{{{self._stream}}}"
        field = f"{self._group} {msg.token.major}-{msg.token.minor}"
        ttl_s = max(int(self._retention_ms / 1000), 3600)
        what = f"counting a redelivered message's start on queue {self._queue}"
        starts = await self._caller.retrying(what, lambda: self._redis.hincrby(key, field, 1))
        await self._caller.retrying(what, lambda: self._redis.expire(key, ttl_s))
        return int(starts)

    async def _replicated(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """``script``'s reply; with ``[redis] min_replicas``, after ``WAIT`` on the same
        connection. An acknowledgement fewer replicas confirmed is kept (the primary has
        it) and logged: a failover now could deliver those messages again."""
        adapter = self._adapter
        replicas = adapter.min_replicas
        result, confirmed = await run_replicated(
            adapter.redis, script, keys, args, replicas, adapter.replica_timeout_ms)
        if confirmed < replicas:
            adapter.replica_log.log(
                logging.WARNING, ("acks", self._queue),
                "queue %d: acknowledgements reached %d of %d replicas within %d ms; a "
                "failover now could deliver them again", self._queue, confirmed,
                replicas, adapter.replica_timeout_ms)
        return result

    async def messages_delivered(self, tokens: Sequence[SequenceToken]) -> None:
        for i in range(0, len(tokens), _ACK_CHUNK):
            await self._ack(tokens[i : i + _ACK_CHUNK])
        if time.monotonic() >= self._next_trim:
            self._next_trim = time.monotonic() + self._trim_interval_s
            await self._trim()

    async def _ack(self, tokens: Sequence[SequenceToken]) -> None:
        ids = joined_ids(tokens)
        what = f"acknowledging on queue {self._queue}"
        if not self._lease_value:
            await self._caller.retrying(what, lambda: self._replicated(
                self._adapter.ack_script, [self._stream], [self._group, ids]))
            return
        result = await self._caller.retrying(what, lambda: self._replicated(
            self._adapter.ack_fenced_script,
            [self._stream, self._lease_key, self._fenced_key],
            [self._group, self._lease_value, ids],
        ))
        if result == -1:
            self._check_lease = True
            raise LeaseLostError(
                f"queue {self._queue}: lease token {self._token} is no longer valid; "
                f"{len(tokens)} acknowledgement(s) refused"
            )
        if log.isEnabledFor(logging.DEBUG):
            # The server's clock at the moment the fenced XACK ran: what proves (in the
            # fencing test) that no ack was *accepted* after the lease moved, whatever
            # time the client got round to logging it.
            _, sec, usec = result
            log.debug("queue %d: acked %d message(s) under token %d at server time %.6f",
                      self._queue, len(tokens), self._token, int(sec) + int(usec) / 1e6)

    async def _lease_held(self) -> None:
        """Raise LeaseLostError unless the server still holds this receiver's lease: a
        server that restarted empty has lost it, and reading on would run messages whose
        acknowledgements the fence refuses — the next owner runs them again."""
        if self._lease_value:
            await lease_held(self._caller, self._lease_key, self._lease_value, self._queue)
        self._check_lease = False

    async def _trim(self) -> None:
        cap_ms = now_ms() - self._retention_ms
        try:
            trimmed = await self._caller.once(
                f"trimming queue {self._queue}",
                lambda: self._adapter.trim_script(keys=[self._stream], args=[cap_ms]),
            )
        except BrokerError as exc:
            log.info("queue %d: trim skipped: %s", self._queue, exc)
            return
        if trimmed:
            log.debug("queue %d: trimmed %d acknowledged entries", self._queue, trimmed)

    async def lag(self) -> int:
        return await self._adapter.lag(self._queue, self._group)

    async def shutdown(self) -> None:
        self._closed = True

    def holder(self, queue: int, group: str) -> str | None:
        """Who this receiver is while it is open on ``queue`` for ``group`` (owners())."""
        if self._closed or self._queue != queue or self._group != group:
            return None
        return f"a receiver in this process ({self._consumer})"


class RedisAdapter(QueueAdapter):
    name = "redis"

    def __init__(self, cfg: Any, *, redis: aioredis.Redis | None = None,
                 max_dead_letters: int = 0, new_group_start: str = "earliest") -> None:
        self.cfg = cfg
        self.new_group_id = "$" if new_group_start == "latest" else "0"
        """Where ``XGROUP CREATE`` puts a new group: ``[queues] new_group_start``."""
        self.max_dead_letters = max_dead_letters
        """``[dead_letters] max_entries``: 0 keeps every letter."""
        # Any: redis-py 8 types replies as unions of every protocol shape.
        self.redis: Any = redis if redis is not None else connect(cfg)
        self.cluster = isinstance(self.redis, ClusterClient)
        self.keys = Keys(cfg.prefix, cluster=self.cluster)
        # Receivers decode XREADGROUP replies themselves (EntryDecoder), straight from
        # the lists hiredis built: redis-py's parser would add a dict per entry.
        self.redis.set_response_callback("XREADGROUP", _raw_reply)
        self.redis.set_response_callback("XRANGE", _raw_reply)
        self.caller = Caller(cfg, self.redis)
        self.ack_script = self.redis.register_script(lua.ACK)
        self.ack_fenced_script = self.redis.register_script(lua.ACK_FENCED)
        self.claim_script = self.redis.register_script(lua.CLAIM_ALL)
        self.trim_script = self.redis.register_script(lua.TRIM_ACKED)
        self.count_script = self.redis.register_script(lua.COUNT_RANGE)
        self.added_script = self.redis.register_script(lua.STREAM_ADDED)
        self.replay_script = self.redis.register_script(lua.REPLAY_LETTER)
        self.replay_marked_script = self.redis.register_script(lua.REPLAY_MARKED)
        self.enqueue_script = self.redis.register_script(lua.ENQUEUE)
        self.dead_letter_script = self.redis.register_script(lua.DEAD_LETTER)
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
        # Receivers handed out and not yet shut down (weakly: a dropped one stops counting).
        self._receivers: weakref.WeakSet[RedisReceiver] = weakref.WeakSet()

    async def check_server(self) -> None:
        """Its eviction policy (see :class:`~conveyor.adapters.redis_eviction.EvictionGuard`)."""
        await self.eviction.check(retry=False)

    async def eviction_policy(self) -> str | None:
        return await self.eviction.summary()

    async def ensure_group(self, queue: int, group: str) -> None:
        """Create ``group`` on the queue's stream where ``[queues] new_group_start`` says:
        at its start (every retained entry) or its end (what is added from now on)."""
        stream = self.keys.queue(queue)

        async def create() -> None:
            try:
                await self.redis.xgroup_create(stream, check_name(group, "app name"),
                                               self.new_group_id, mkstream=True)
            except rex.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        await self.caller.retrying(f"creating group {group!r} on queue {queue}", create)
        self._groups_ready.add((queue, group))

    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        """Append in order, each message once, however often the call is retried.

        One :data:`~conveyor.adapters.redis_scripts.ENQUEUE` call per chunk (one round
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
        if not self.eviction.checked:  # before the first: a server that may evict refuses
            await self.eviction.check(retry=True)
        stream = self.keys.queue(queue)
        window = self.publish_window_ms
        chunks = publish_chunks(messages)
        calls = [
            ([stream, self.keys.published(queue, uuid.uuid4().hex)], [window, *enqueue_args(c)])
            for c in chunks
        ]

        script = self.enqueue_script
        reached = False  # whether some attempt may have got its request to the server

        replicas = self.min_replicas

        async def pipelined(client: aioredis.Redis) -> list[Any]:
            # ``async with``: a failure while loading the script (before execute's own
            # clean-up) would otherwise leave the connection checked out of the pool.
            pipe: Any
            async with client.pipeline(transaction=False) as pipe:
                pipe.scripts.add(script)  # loaded first should the server not know it
                for keys, args in calls:
                    pipe.evalsha(script.sha, 2, *keys, *args)
                if replicas:  # on the same connection as the writes, as WAIT requires
                    pipe.execute_command("WAIT", replicas, self.replica_timeout_ms)
                # Errors in place: a chunk refused must not hide the ones written.
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            refused = [r for r in replies if isinstance(r, Exception)]
            if refused and (len(refused) >= len(calls) or not all(
                    isinstance(r, rex.ResponseError) and not isinstance(r, CLUSTER_ERRORS)
                    for r in refused)):
                raise refused[0]  # none written, or worth a retry (a slot moved)
            return replies

        async def send() -> list[Any]:
            nonlocal reached
            try:
                if len(calls) == 1 and not replicas:
                    keys, args = calls[0]
                    return [await script(keys=keys, args=args)]
                return await on_primary(self.redis, stream, pipelined)
            except BaseException as exc:
                reached = reached or not _while_connecting(exc)
                raise

        what = f"publishing {len(messages)} messages to queue {queue}"
        try:
            replies = await self.caller.retrying(what, send)
        except BrokerConnectionError as exc:
            if not reached:  # every attempt failed to connect: nothing was sent
                raise
            raise PublishUncertain(
                f"redis: {what}: the connection failed and retries ran out after "
                f"{self.caller.retry_max_s:g}s ($.redis.retry_max_s): the messages may or "
                f"may not have been written ({exc}); their ids are in .message_ids",
                tuple(m.id for m in messages),
            ) from exc
        confirmed = int(replies.pop()) if replicas else 0
        tokens: list[SequenceToken] = []
        published: dict[str, SequenceToken] = {}
        failures: list[tuple[list[str], BaseException]] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, Exception):  # refused whole: see ENQUEUE
                failures.append(([m.id for m in chunk],
                                 BrokerError(f"redis error while {what}: {reply}")))
                continue
            runs, replayed = reply
            if replayed:
                self.replayed_batches += 1
            chunk_tokens = tokens_of_runs(runs, queue)
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
            raise publish_failure(f"redis: {what}", [m.id for m in messages], published,
                                  failures)
        return tokens

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = RedisReceiver(self, queue, group)
        self._receivers.add(receiver)
        return receiver

    async def dead_letter(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """One entry per letter on ``PREFIX:dlq:APP`` (see conveyor.platform.letters), by
        :data:`~conveyor.adapters.redis_scripts.DEAD_LETTER`: under a batch id, so a call
        retried after its reply was lost stores nothing twice (as a publish). With
        ``[dead_letters] max_entries``, an exact ``XTRIM MAXLEN`` in the same script,
        whose count of evicted letters is returned."""
        key = self.keys.dead_letters(group)
        args: list[Any] = [self.publish_window_ms, self.max_dead_letters]
        for letter in letters:
            flat = letter_entry(letter, group)
            args += [len(flat), *flat]
        keys = [key, self.keys.letters_stored(group, uuid.uuid4().hex)]
        evicted = await self.caller.retrying(
            f"storing dead letters of {group!r}",
            lambda: self.dead_letter_script(keys=keys, args=args))
        return int(evicted)

    # -- dead letters, for operators (see conveyor.adapters.redis_letters) --------------
    async def list_dead_letters(self, group: str, limit: int = 100, *,
                                after: str | None = None) -> list[StoredLetter]:
        return stored_letters(await redis_letters.list_letters(self, group, limit, after))

    async def find_dead_letter(self, group: str, letter_id: str) -> StoredLetter | None:
        found = stored_letters(await redis_letters.find_letter(self, group, letter_id))
        return found[0] if found else None

    async def count_dead_letters(self, group: str) -> int:
        return await redis_letters.count_letters(self, group)

    async def delete_dead_letters(self, group: str, ids: Sequence[str]) -> int:
        return await redis_letters.delete_letters(self, group, ids)

    async def replay_dead_letters(self, group: str, replays: Sequence[Replay]
                                  ) -> list[SequenceToken | None]:
        """One Lua script per letter (XADD to the queue, XDEL of the letter: atomic), the
        scripts of a batch in one pipeline."""
        return await redis_letters.replay_letters(
            self, group, [(r.letter_id, r.queue, encode_fields(r.message)) for r in replays]
        )

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
            return await self._count_after(stream, last, before)

        return await self.caller.retrying(f"reading {group!r}'s position on queue {queue}", count)

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
                "counting entries", lambda: self._count_after(stream, before, last)
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

    async def _count_after(self, stream: str, first: bytes | str, last: bytes | str) -> int:
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
        """Entries not yet delivered to ``group`` plus those delivered but not acked."""
        stream = self.keys.queue(queue)

        async def read() -> int:
            if not await self.redis.exists(stream):
                return 0
            for g in await self.redis.xinfo_groups(stream):
                if g["name"].decode() != group:
                    continue
                undelivered = g.get("lag")
                if undelivered is None:  # Redis cannot tell (after deletions): count
                    undelivered = await self._count_after(stream, g["last-delivered-id"], "+")
                return int(g["pending"]) + int(undelivered)
            return int(await self.redis.xlen(stream))  # a new group would read everything

        return await self.caller.retrying(f"reading the lag of queue {queue}", read)

    async def close(self) -> None:
        await close(self.redis)

    # -- consumer groups, for operators (see conveyor.adapters.redis_groups) -----------
    async def groups(self, queues: Sequence[int]) -> list[GroupInfo]:
        from conveyor.adapters import redis_groups  # it builds on this module

        return await redis_groups.groups(self, queues)

    async def delete_group(self, group: str, queues: Sequence[int], *,
                           dead_letters: bool = False) -> list[int]:
        from conveyor.adapters import redis_groups

        return await redis_groups.delete_group(self, group, queues, dead_letters=dead_letters)


def from_config(config: Any) -> RedisAdapter:
    return RedisAdapter(config.redis, max_dead_letters=config.dead_letters.max_entries,
                        new_group_start=config.queues.new_group_start)


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
