"""One queue's consumer side for one group: read (``XREADGROUP``), claim the previous
owner's pending entries, acknowledge under the lease's fence, trim.

A read whose reply is lost (connection dropped, server restarting) has left entries
in this consumer's pending list; the next read re-reads that list from the last entry
delivered, so nothing is stranded.

A read is not fenced: fencing it (a script around ``XREADGROUP``) would triple the
server's cost of every message read. A daemon stalled (SIGSTOP, a VM pause) between
checking its lease and its read reaching the server can therefore read entries after
the queue moved, into its own pending list, after the new owner's claim. The owner
looks for such strays every :data:`STRAY_SWEEP_S` (:meth:`RedisReceiver._strays`) and
runs them as redelivered messages: later than messages of their streams it has run
already, never lost.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from conveyor.adapters.redis.codec import EntryDecoder
from conveyor.adapters.redis.connections import run_replicated
from conveyor.adapters.redis.coordination import lease_held
from conveyor.adapters.redis.errors import Caller, unblocked
from conveyor.adapters.redis.keys import Keys, check_name, joined_ids, stall_field, token_of
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.config import RedisConfig
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    LeaseLostError,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import (
    Message,
    now_ms,
)
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.redis")

_ACK_CHUNK = 4000  # ids per script call (Lua's unpack limit is ~8000)
STRAY_SWEEP_S = 5.0
"""How often a lease holder looks for entries pending for another consumer (see the
module's docstring): one ``XPENDING`` summary a queue."""
UNREAD_COUNTED = 100
"""At most this many unread entries are counted by :meth:`RedisReceiver._unread_deleted`
(each sweep): a longer backlog is looked at once it is shorter."""
UNCONFIRMED_KEPT = 64
"""Unconfirmed acknowledgement calls remembered for :meth:`RedisReceiver._ack_again`."""


class ReceiverHost(Protocol):
    """What a receiver uses of its adapter (:class:`~conveyor.adapters.redis.adapter.\
RedisAdapter` is one): the connection, the key layout, the scripts, the replica rule.
    A protocol, so the receiver imports nothing of the adapter that makes it."""

    cfg: RedisConfig
    redis: Any
    caller: Caller
    keys: Keys
    claim_script: Any
    strays_script: Any
    unread_deleted_script: Any
    hand_back_script: Any
    ack_script: Any
    ack_fenced_script: Any
    trim_script: Any
    count_start_script: Any
    min_replicas: int
    replica_timeout_ms: int
    replica_log: ThrottledLog

    async def ensure_group(self, queue: int, group: str, *, again: bool = False) -> None: ...

    async def lag(self, queue: int, group: str) -> int: ...


def _default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class RedisReceiver(QueueReceiver):
    """One queue for one group. Not shared between tasks: one agent drives it."""

    def __init__(self, adapter: ReceiverHost, queue: int, group: str) -> None:
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
        self._next_sweep = 0.0
        self._strays_seen: set[bytes] = set()
        """Strays returned already (:meth:`_strays`): they stay in the other consumer's
        pending list until acknowledged, and must not be returned twice meanwhile."""
        # Acknowledgements the replicas did not confirm ([redis] min_replicas): a
        # failover may have lost them, leaving the entries pending for this consumer,
        # which reads only new entries: they are sent again after a lost connection.
        self._unconfirmed: list[list[SequenceToken]] = []
        self._reack = False
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
        claimed, deleted = claimed
        if deleted:
            self._lost(deleted, "the previous owner")
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
        self._next_sweep = time.monotonic() + STRAY_SWEEP_S
        self._strays_seen.clear()
        self._closed = False

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        if self._check_lease:
            await self._lease_held()
        if self._reack:
            await self._ack_again()
        if self._history_from is not None:
            out = await self._read(self._history_from, max_count, None)
            if out:
                return out
            self._history_from = None
        if self._lease_value and time.monotonic() >= self._next_sweep:
            out = await self._strays(max_count)
            if out:
                return out
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
            self._reack = bool(self._unconfirmed)
            raise
        except BrokerError as exc:
            if unblocked(exc.__cause__):  # nothing read: the next read finds where it went
                log.info("queue %d: the blocking read of %s ended: the stream's slot moved "
                         "(a reshard) or the stream was deleted; reading again",
                         self._queue, self._stream)
                return []
            if "NOGROUP" in str(exc):  # the stream or group was deleted: recreate, go on
                await self._lease_held()  # unless the lease went with it (an empty restart)
                await self._group_again()
                return []
            raise
        if not reply:
            return []
        # RESP2: [[stream, entries]]; RESP3: {stream: entries}.
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        if not entries:
            return []
        last = entries[-1][0]
        out = self._decoder.decode_all(entries)
        if start != b">" and out:
            # Before moving past these entries: if this call fails (a failover), the
            # next read of the pending list returns them again.
            out = await self._with_deliveries(out, entries[0][0], last, len(entries))
        self._last_id = last
        if start != b">":
            self._history_from = last
        if len(out) < len(entries):  # pending, but trimmed or deleted meanwhile: ack them
            queue = self._queue
            gone = [token_of(eid, queue) for eid, fields in entries if not fields]
            if gone:
                self._lost(len(gone), "this daemon")
                await self.acknowledge(gone)
        return out

    async def _group_again(self) -> None:
        """Create the group deleted under this receiver (``XGROUP DESTROY``, the stream's
        ``DEL``) again, at the stream's start: its position is gone with it, and every
        entry the stream still holds may be one not handled yet. Those it had handled
        run again; said so when there are any."""
        await self._adapter.ensure_group(self._queue, self._group, again=True)
        held = await self._caller.once(f"reading the length of queue {self._queue}",
                                       lambda: self._redis.xlen(self._stream))
        if not held:
            log.info("queue %d: %s or its group %r was deleted (NOGROUP); creating the "
                     "group again", self._queue, self._stream, self._group)
            return
        log.warning("queue %d: %s or its group %r was deleted (NOGROUP); creating the "
                    "group again at the stream's start, so its position is lost: the %d "
                    "entries the stream holds are delivered, those handled already a "
                    "second time", self._queue, self._stream, self._group, held)

    def _lost(self, count: int, whose: str) -> None:
        """Say that ``count`` pending entries were gone from the stream: messages read,
        not acknowledged, then deleted by another client (``XDEL``, an ``XTRIM``; Conveyor
        trims only what every group acknowledged). Nothing is left to run or to redeliver:
        they are lost, and said so, not passed over."""
        log.error("queue %d: %d pending entr%s of %s had been deleted from %s by another "
                  "client (XDEL or XTRIM) before being handled: those messages are lost",
                  self._queue, count, "y" if count == 1 else "ies", whose, self._stream)

    async def _unread_deleted(self) -> None:
        """Say how many entries another client deleted before this group read them (an
        ``XTRIM`` past its position: ``UNREAD_DELETED``): lost, never delivered, and not
        pending either, so no other check sees them. Looked at with the strays."""
        gone = await self._caller.once(
            f"looking for unread entries deleted from queue {self._queue}",
            lambda: self._adapter.unread_deleted_script(
                keys=[self._stream], args=[self._group, UNREAD_COUNTED]))
        if gone:
            log.error("queue %d: %d entr%s of %s not yet read by group %r had been deleted "
                      "by another client (XTRIM) before being read: those messages are lost",
                      self._queue, gone, "y" if gone == 1 else "ies", self._stream,
                      self._group)

    async def _strays(self, max_count: int) -> list[Message]:
        """Entries pending for other consumers than this lease holder (``STRAYS``), as
        messages delivered once more than Redis counts, oldest first; not claimed, so a
        lost reply strands nothing. Looked for again at once while some are left."""
        # Looked for again a while later whatever happens: a failed look delays no read.
        self._next_sweep = time.monotonic() + STRAY_SWEEP_S
        await self._unread_deleted()
        reply = await self._caller.once(
            f"looking for stray entries on queue {self._queue}",
            lambda: self._adapter.strays_script(
                keys=[self._stream, self._lease_key],
                args=[self._group, self._consumer, self._lease_value, max_count]))
        if reply == -1:
            self._check_lease = True
            raise LeaseLostError(f"queue {self._queue}: lease lost (looking for strays)")
        seen = self._strays_seen
        found = [(reply[i], reply[i + 1], int(reply[i + 2])) for i in range(0, len(reply), 3)]
        fresh = [row for row in found if row[0] not in seen]
        if len(fresh) == max_count:  # more may be left: look again at the next read
            self._next_sweep = 0.0
        if not found:
            seen.clear()
            return []
        fresh.sort(key=lambda row: tuple(int(p) for p in row[0].split(b"-")))
        seen.update(eid for eid, _, _ in fresh)
        gone = [token_of(eid, self._queue) for eid, fields, _ in fresh if not fields]
        if gone:  # deleted or trimmed meanwhile: nothing to run
            self._lost(len(gone), "a stalled daemon")
            await self.acknowledge(gone)
        out = self._decoder.decode_all([[eid, fields] for eid, fields, _ in fresh if fields])
        # Delivered once more than Redis counts: the stalled daemon's read counted one.
        counts = {token_of(eid, self._queue): n + 1 for eid, fields, n in fresh if fields}
        replace = msgspec.structs.replace
        marked = [replace(m, deliveries=counts.get(m.token, 2)) if m.token else m
                  for m in out]
        if marked:
            log.warning("queue %d: %d entr%s read by a stalled daemon after the queue "
                        "moved; running %s now", self._queue, len(marked),
                        "y" if len(marked) == 1 else "ies", "it" if len(marked) == 1 else "them")
        return marked

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
        """``XCLAIM ... RETRYCOUNT 0 JUSTID`` under the lease's fence (``HAND_BACK``): the
        next owner's read of its pending list then counts them as first deliveries. A
        daemon stalled past its lease between its check and this call would otherwise
        take the new owner's claimed entries back into its own pending list."""
        for i in range(0, len(tokens), _ACK_CHUNK):
            ids = joined_ids(tokens[i:i + _ACK_CHUNK])
            done = await self._caller.once(
                f"handing back unstarted messages of queue {self._queue}",
                lambda ids=ids: self._adapter.hand_back_script(  # type: ignore[misc]
                    keys=[self._stream, self._lease_key],
                    args=[self._group, self._consumer, self._lease_value, ids]))
            if done == -1:
                self._check_lease = True
                raise LeaseLostError(
                    f"queue {self._queue}: lease token {self._token} is no longer valid; "
                    "unstarted messages not handed back")

    async def count_start(self, msg: Message) -> Message:
        """``HINCRBY`` of the message's field in the queue's delivery records (a hash
        beside the stream, same hash slot, kept as long as entries are: ``retention_s``),
        and the stall a previous owner recorded for it (``note_stall``), if any: one
        script call (``COUNT_START``), since recovery counts these one at a time."""
        assert msg.token is not None
        key = self._adapter.keys.starts(self._queue)
        field = f"{self._group} {msg.token.major}-{msg.token.minor}"
        ttl_s = max(int(self._retention_ms / 1000), 3600)
        script = self._adapter.count_start_script
        starts, cause = await self._caller.retrying(
            f"counting a redelivered message's start on queue {self._queue}",
            lambda: script(keys=[key], args=[field, ttl_s, stall_field(self._group, msg.id)]))
        return msgspec.structs.replace(
            msg, deliveries=int(starts) + 1,
            last_cause=cause.decode() if isinstance(cause, bytes) else (cause or ""))

    async def _replicated(self, script: Any, keys: list[str], args: list[Any],
                          tokens: Sequence[SequenceToken]) -> Any:
        """``script``'s reply; with ``[redis] min_replicas``, after ``WAIT`` on the same
        connection. An acknowledgement fewer replicas confirmed is kept (the primary has
        it), logged, and remembered: after a lost connection (a failover may have lost
        it) it is sent again (:meth:`_ack_again`). A confirmed one confirms every earlier
        write too (replication is one stream), so the remembered ones are forgotten."""
        adapter = self._adapter
        replicas = adapter.min_replicas
        result, confirmed = await run_replicated(
            adapter.redis, script, keys, args, replicas, adapter.replica_timeout_ms)
        if confirmed < replicas:
            adapter.replica_log.log(
                logging.WARNING, ("acks", self._queue),
                "queue %d: acknowledgements reached %d of %d replicas within %d ms; "
                "they are sent again after a failover", self._queue, confirmed,
                replicas, adapter.replica_timeout_ms)
            self._unconfirmed.append(list(tokens))
            del self._unconfirmed[:-UNCONFIRMED_KEPT]
        elif replicas:
            self._unconfirmed.clear()
        return result

    async def _ack_again(self) -> None:
        """Send the unconfirmed acknowledgements again (XACK of an acknowledged entry
        changes nothing; fenced as every acknowledgement)."""
        again, self._unconfirmed, self._reack = self._unconfirmed, [], False
        for tokens in again:
            await self._ack(tokens)

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
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
                self._adapter.ack_script, [self._stream], [self._group, ids], tokens))
            return
        result = await self._caller.retrying(what, lambda: self._replicated(
            self._adapter.ack_fenced_script,
            [self._stream, self._lease_key, self._fenced_key],
            [self._group, self._lease_value, ids], tokens,
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
