"""Membership and leases in Redis, for daemons on any number of machines.

Membership: a sorted set of member ids scored by their expiry (server clock) plus a
hash of their descriptions. A daemon heartbeats every ``heartbeat_interval_s``; a
daemon that stops (killed, paused, partitioned) vanishes ``member_ttl_s`` after its
last heartbeat. Every reader gets the same view, sorted by id. A version counter grows
whenever the ids change, so waiting for a change polls one integer, not every record
(the records carry each daemon's statistics: at a thousand daemons the whole view is
most of a megabyte — see ``conveyor sim balancer``).

Leases: one key per queue holding ``"<token> <owner>"`` with a TTL, the token drawn
from a per-queue counter (``INCR``) so it only grows; a generation counter per app
counts grants and releases, so a settled balancer can tell nothing moved without
reading every lease. Acquire, renew and release are
Lua scripts: a check and its write cannot interleave with another daemon's.

A server that lost its data (restarted empty) must not repeat a counter's value: a
repeated token would pass a stale owner's acknowledgements through the fence, a
repeated generation or version could tell a balancer that nothing moved. A missing
counter starts at the server's clock in ms (``_SEEDED`` in
:mod:`~conveyor.adapters.redis.scripts`). A lease found gone (not merely renewed late)
is reported lost at once, and a receiver reads no more on it (:func:`lease_held`).

A key of another type where one of these belongs (``SET PREFIX:app:APP:members x``,
another tool's list at a lease's name) fails the script that touches it with
``WRONGTYPE``: the call raises :class:`StoreUnfitError` naming the key, its type and the
type that belongs there (:func:`naming_wrong_types`). A lease whose key holds something
else is no longer this daemon's: a renewal reports it lost, a release lets it be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec

from conveyor.adapters.redis import scripts as lua
from conveyor.adapters.redis.connections import (
    ClusterClient,
    close,
    connect,
    key_types,
    mget,
    run_replicated,
)
from conveyor.adapters.redis.errors import Caller, wrong_type, wrong_type_line
from conveyor.adapters.redis.keys import Keys, check_name, stall_field
from conveyor.platform.balancing.leases import Lease, LeaseStore
from conveyor.platform.balancing.membership import MemberInfo, Membership, timer_phase
from conveyor.platform.config import Config
from conveyor.platform.errors import BrokerError, LeaseLostError, StoreUnfitError
from conveyor.platform.tasks import cancel_and_wait
from conveyor.platform.throttled_log import EpisodeLog, ThrottledLog

log = logging.getLogger("conveyor.redis")

_encode = msgspec.json.Encoder().encode
_decode_member = msgspec.json.Decoder(MemberInfo).decode
_POLL_S = 0.2

Store = tuple[str, str, str]
"""A key, what Conveyor keeps there (``app 'shop''s members``), the type that belongs."""

_FIX = "rename or delete the key (Conveyor writes it anew)"


@contextlib.asynccontextmanager
async def naming_wrong_types(caller: Caller, stores: Sequence[Store]) -> AsyncIterator[None]:
    """Turn a ``WRONGTYPE`` refusal of a call in the block into :class:`StoreUnfitError`
    naming each of ``stores`` that holds another type (one ``TYPE`` each, read then; the
    refusal's own text where each looks right by now: fixed meanwhile). Other errors go
    on as they are."""
    try:
        yield
    except BrokerError as exc:
        if not wrong_type(exc.__cause__):
            raise
        found = await caller.retrying(
            "reading the types of the balancer's keys",
            lambda: key_types(caller.redis, [key for key, _, _ in stores]))
        wrong = [wrong_type_line(key, holds, kind, wanted, _FIX)
                 for (key, holds, wanted), kind in zip(stores, found, strict=True)
                 if kind not in (wanted, "none")]
        raise StoreUnfitError("; ".join(wrong) if wrong else
                              f"{exc} (its keys are of their types by now)") from exc


class RedisMembership(Membership):
    def __init__(
        self, caller: Caller, keys: Keys, group: str, *, ttl_s: float, heartbeat_s: float
    ) -> None:
        self._caller = caller
        self._redis: Any = caller.redis
        self._keys = [keys.members(group), keys.member_info(group),
                      keys.members_version(group)]
        self._stores: list[Store] = [
            (self._keys[0], f"app {group!r}'s members", "zset"),
            (self._keys[1], f"app {group!r}'s member records", "hash"),
            (self._keys[2], f"app {group!r}'s members' version", "string")]
        self._beats = EpisodeLog(log, "heartbeat failed")
        self._ttl_ms = int(ttl_s * 1000)
        self._heartbeat_s = heartbeat_s
        self._put = self._redis.register_script(lua.MEMBER_PUT)
        self._list = self._redis.register_script(lua.MEMBERS)
        self._ids = self._redis.register_script(lua.MEMBER_IDS)
        self._version = self._redis.register_script(lua.MEMBERS_VERSION)
        self._me: MemberInfo | None = None
        self._beating: asyncio.Task[None] | None = None
        self._last_version: int | None = None

    async def _call(self, what: str, script: Any, args: list[Any]) -> Any:
        async with naming_wrong_types(self._caller, self._stores):
            return await self._caller.retrying(
                what, lambda: script(keys=self._keys, args=args))

    async def _write(self, member: MemberInfo) -> None:
        await self._call("registering this daemon", self._put,
                         [member.id, _encode(member), self._ttl_ms])

    async def join(self, member: MemberInfo) -> None:
        self._me = member
        await self._write(member)
        if self._beating is None or self._beating.done():
            self._beating = asyncio.create_task(self._heartbeat_loop(), name="redis-heartbeat")

    async def leave(self, member_id: str) -> None:
        if self._me is not None and self._me.id == member_id:
            self._me = None
            if self._beating is not None:
                await cancel_and_wait(self._beating)
                self._beating = None
        await self._call("leaving the membership", self._put, [member_id, "", ""])

    async def heartbeat(self, member: MemberInfo) -> None:
        """Publish ``member``; our own record goes out with the next beat of the loop
        :meth:`join` started rather than in a second write of its own."""
        if self._me is not None and self._me.id == member.id:
            self._me = member
            if self._beating is not None and not self._beating.done():
                return
        await self._write(member)

    async def _heartbeat_loop(self) -> None:
        # The first beat comes early by this daemon's phase: out of step with the others.
        phase = timer_phase(self._me.id) if self._me is not None else 1.0
        delay_s = self._heartbeat_s * phase
        while self._me is not None:
            await asyncio.sleep(delay_s)
            delay_s = self._heartbeat_s
            me = self._me
            if me is None:
                return
            try:
                await self._write(me)
            except StoreUnfitError as exc:  # said once, not every beat
                self._beats.failed(exc)
            except BrokerError as exc:
                log.warning("heartbeat failed: %s", exc)
            else:
                self._beats.ok()

    async def members(self) -> list[MemberInfo]:
        flat = await self._call("reading the membership", self._list, [])
        self._last_version = int(flat[0])
        out: list[MemberInfo] = []
        for i in range(1, len(flat), 2):
            ident, info = flat[i].decode(), flat[i + 1]
            try:
                out.append(_decode_member(info))
            except msgspec.DecodeError:
                out.append(MemberInfo(id=ident, host="?", pid=0, started_at=0.0))
        return out

    async def member_ids(self) -> list[str]:
        reply = await self._call("reading the membership", self._ids, [])
        self._last_version = int(reply[0])
        return [ident.decode() for ident in reply[1:]]

    async def version(self) -> int:
        reply = await self._call("reading the membership", self._version, [])
        self._last_version = int(reply)
        return self._last_version

    async def wait_changed(self, timeout_s: float) -> bool:
        """Poll the view's version every 0.2 s (expiry has no event) until it differs
        from the last one read."""
        deadline = time.monotonic() + timeout_s
        before = self._last_version
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(_POLL_S, left))
            try:
                now = await self.version()
            except BrokerError:
                continue
            if before is None or now != before:
                return True

    async def close(self) -> None:
        if self._beating is not None:
            await cancel_and_wait(self._beating)
            self._beating = None


class RedisLeaseStore(LeaseStore):
    def __init__(self, caller: Caller, keys: Keys, group: str, total_queues: int, *,
                 replicas: int = 0, replica_timeout_ms: int = 1000) -> None:
        self._caller = caller
        self._redis: Any = caller.redis
        self._keys = keys
        self._group = check_name(group, "app name")
        self._total = total_queues
        self._generation_key = keys.leases_generation(self._group)
        # On a cluster the counter cannot share a slot with every queue's lease: the
        # scripts get no third key and it is bumped by a call of its own (it is a hint:
        # see generation()).
        self._bump_apart = keys.cluster
        self._acquire = self._redis.register_script(lua.LEASE_ACQUIRE)
        self._renew = self._redis.register_script(lua.LEASE_RENEW)
        self._release = self._redis.register_script(lua.LEASE_RELEASE)
        self._bump_script = self._redis.register_script(lua.COUNTER_BUMP)
        self._read_counter = self._redis.register_script(lua.COUNTER_READ)
        # Local monotonic times at which leases we were refused are due to expire.
        self._blocked_until: dict[int, float] = {}
        self._replicas = replicas
        self._replica_timeout_ms = replica_timeout_ms
        self._replica_log = ThrottledLog(log, interval_s=30.0)
        self._generation_store: Store = (
            self._generation_key, f"app {self._group!r}'s lease generation", "string")

    async def note_stall(self, queue: int, message_id: str, what: str) -> None:
        """``HSET`` in the queue's delivery records, read by the next owner's
        ``count_start`` when the message comes back (kept a day)."""
        key = self._keys.starts(queue)
        field = stall_field(self._group, message_id)

        async def note() -> Any:
            await self._redis.hset(key, field, what)
            return await self._redis.expire(key, 86_400)

        await self._caller.retrying(f"recording a stall on queue {queue}", note)

    async def close(self) -> None:
        """Close the connection pool the two stores share (the lease store owns it)."""
        await close(self._redis)

    def _short(self, what: str, queue: int, confirmed: int) -> None:
        self._replica_log.log(
            logging.WARNING, (what, queue),
            "queue %d: %s reached %d of %d replicas within %d ms", queue, what, confirmed,
            self._replicas, self._replica_timeout_ms)

    def _lease_stores(self, queue: int) -> list[Store]:
        app = f"app {self._group!r}'s"
        return [(self._keys.lease(self._group, queue), f"{app} lease of queue {queue}",
                 "string"),
                (self._keys.fence(self._group, queue),
                 f"{app} fencing counter of queue {queue}", "string")]

    async def _run(self, what: str, script: Any, keys: list[str], args: list[Any],
                   *, queue: int, retry: bool = True, replicated: bool = True
                   ) -> tuple[Any, int]:
        """``script`` on ``queue``'s keys (with ``WAIT`` when ``[redis] min_replicas`` is
        set and ``replicated``): its reply and the replicas that confirmed it."""
        replicas = self._replicas if replicated else 0

        def call() -> Awaitable[tuple[Any, int]]:
            return run_replicated(self._redis, script, keys, args, replicas,
                                  self._replica_timeout_ms)

        stores = [*self._lease_stores(queue), self._generation_store]
        async with naming_wrong_types(self._caller, [s for s in stores if s[0] in keys]):
            if retry:
                return await self._caller.retrying(what, call)
            return await self._caller.once(what, call)

    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        """The lease, or None while another holds it. With ``min_replicas``, a lease the
        replicas did not confirm is given back and not taken (a failover could otherwise
        let two daemons own the queue); the balancer tries again next round."""
        started = time.monotonic()
        keys = [self._keys.lease(self._group, queue), self._keys.fence(self._group, queue)]
        if not self._bump_apart:
            keys.append(self._generation_key)
        reply, confirmed = await self._run(
            f"acquiring the lease of queue {queue}", self._acquire, keys,
            [owner, int(ttl_s * 1000)], queue=queue)
        token = int(reply[0])
        if token == 0:
            pttl = int(reply[1])
            self._blocked_until[queue] = started + max(pttl, 0) / 1000
            return None
        self._blocked_until.pop(queue, None)
        await self._bump()
        lease = Lease(queue, owner, token, started + ttl_s)
        if confirmed < self._replicas:
            self._short("a lease taken", queue, confirmed)
            await self.release(lease)
            return None
        return lease

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        """The renewed lease; None if it is no longer ours. A renewal the replicas did not
        confirm leaves the lease as it was (its old deadline), to be renewed again."""
        started = time.monotonic()
        key = self._keys.lease(self._group, lease.queue)
        try:
            ok, confirmed = await self._run(
                f"renewing the lease of queue {lease.queue}", self._renew, [key],
                [f"{lease.token} {lease.owner}", int(ttl_s * 1000)], queue=lease.queue,
                retry=False)
        except StoreUnfitError as exc:  # our value is gone from it: the lease is lost
            log.error("queue %d: the lease (token %d) is lost: %s", lease.queue,
                      lease.token, exc)
            return None
        if ok != 1:
            if ok == -1:
                log.warning("queue %d: the lease (token %d) is gone from the server: "
                            "it expired before this renewal, or the server lost it "
                            "(restarted empty, the key evicted)", lease.queue, lease.token)
            return None
        if confirmed < self._replicas:
            self._short("a lease renewal", lease.queue, confirmed)
            return lease
        return Lease(lease.queue, lease.owner, lease.token, started + ttl_s)

    async def release(self, lease: Lease) -> bool:
        """Give the lease back. Not waited on the replicas: a release lost in a failover
        leaves the lease to expire at its deadline, as a crashed owner's does, so waiting
        would only hold the caller (``replica_timeout_ms`` more for a lease taken short
        of its replicas, while they are down). Raises :class:`StoreUnfitError` when the
        lease's key holds something else, :class:`BrokerError` when Redis stayed
        unreachable: the caller says so (the lease lapses at its TTL)."""
        key = self._keys.lease(self._group, lease.queue)
        keys = [key] if self._bump_apart else [key, self._generation_key]
        released, _ = await self._run(
            f"releasing the lease of queue {lease.queue}", self._release, keys,
            [f"{lease.token} {lease.owner}"], queue=lease.queue, replicated=False)
        if released:
            await self._bump()
        return bool(released)

    async def _bump(self) -> None:
        """Cluster only: count a grant or release in the generation. A bump lost to an
        outage only delays a move: a settled balancer re-reads every lease every 30-60
        intervals whatever the counter says."""
        if not self._bump_apart:
            return
        try:
            await self._caller.once("counting a lease change",
                                    lambda: self._bump_script(keys=[self._generation_key]))
        except BrokerError as exc:
            log.info("the leases' generation was not bumped: %s", exc)

    async def owners(self) -> dict[int, str]:
        keys = [self._keys.lease(self._group, q) for q in range(self._total)]
        values = await self._caller.retrying("reading leases", lambda: mget(self._redis, keys))
        return {
            q: v.decode().partition(" ")[2] for q, v in enumerate(values) if v is not None
        }

    async def generation(self) -> int:
        async with naming_wrong_types(self._caller, [self._generation_store]):
            value = await self._caller.retrying(
                "reading the leases' generation",
                lambda: self._read_counter(keys=[self._generation_key]))
        return int(value)

    async def wait_released(self, timeout_s: float) -> None:
        """Sleep until the soonest refused lease is due to expire, or ``timeout_s``; while
        a refused lease is still held, return as soon as any lease is released or granted
        (the generation moves, polled every 0.2 s), so a daemon waiting for a hand-off
        takes the queue when it is released, not at the next interval."""
        now = time.monotonic()
        due = [t for t in self._blocked_until.values() if t > now]
        wait_s = max(min([timeout_s, *(t - now + 0.02 for t in due)]), 0.0)
        if not due and self._blocked_until:
            wait_s = min(timeout_s, 0.05)  # overdue: try again almost at once
            self._blocked_until.clear()
        if not due:
            await asyncio.sleep(wait_s)
            return
        await _until_changed(self.generation, wait_s)


async def lease_held(caller: Caller, key: str, value: str, queue: int) -> None:
    """Raise LeaseLostError unless the lease ``key`` still holds ``value``."""
    held = await caller.once(f"checking the lease of queue {queue}",
                             lambda: caller.redis.get(key))
    if held != value.encode():
        token = value.partition(" ")[0]
        raise LeaseLostError(
            f"queue {queue}: lease token {token} is "
            + ("gone from the server (expired, or the server restarted empty)"
               if held is None
               else "held by another daemon now")
            + "; reading no more on it")


async def _until_changed(read: Callable[[], Awaitable[int]], timeout_s: float) -> bool:
    """Poll ``read`` every 0.2 s for up to ``timeout_s``; True once it differs from its
    first value. A store that cannot be read counts as unchanged."""
    deadline = time.monotonic() + timeout_s
    try:
        before: int | None = await read()
    except BrokerError:
        before = None
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(_POLL_S, left))
        try:
            now = await read()
        except BrokerError:
            continue
        if before is None:
            before = now
        elif now != before:
            return True
    return False


def redis_coordination(config: Config, group: str) -> tuple[Membership, LeaseStore]:
    """``[balancer] membership = "redis"``: both stores share one connection pool."""
    cfg = config.redis
    redis = connect(cfg)
    caller = Caller(cfg, redis)
    keys = Keys(cfg.prefix, cluster=isinstance(redis, ClusterClient))
    membership = RedisMembership(
        caller, keys, group, ttl_s=cfg.member_ttl_s, heartbeat_s=cfg.heartbeat_interval_s
    )
    return membership, RedisLeaseStore(caller, keys, group, config.queues.total,
                                       replicas=cfg.min_replicas,
                                       replica_timeout_ms=cfg.replica_timeout_ms)
