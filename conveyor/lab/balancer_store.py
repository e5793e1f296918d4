"""An in-memory membership and lease store that counts what Redis would be asked.

:class:`SimStore` holds the shared state; each simulated daemon talks to it through its
own :class:`SimMembership` and :class:`SimLeaseStore`, implementations of the
:class:`~conveyor.platform.balancing.membership.Membership` and
:class:`~conveyor.platform.balancing.leases.LeaseStore` ports.

They mirror :mod:`conveyor.adapters.redis.coordination` call for call, because the cost
of the balancer *is* those calls: the same scripts with the same semantics (member
expiry on the store's clock, lapsed members dropped by whichever script runs next, lease
grants refused while another owner's key lives, fencing tokens from a counter, the
members' version and the leases' generation), the same background heartbeat, the same
polling in ``wait_changed`` and ``wait_released``, and one ``MGET`` of every lease key
for ``owners()``. Each call is counted as one operation with the bytes its RESP request
and reply would take on the wire, under the category the balancer spends it on. A
change to the Redis adapter's calls must be mirrored here.

Time is the running loop's clock, so under :mod:`conveyor.lab.virtual_time` the store
and the balancers share one virtual clock.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from conveyor.platform.balancing.leases import Lease, LeaseStore
from conveyor.platform.balancing.membership import MemberInfo, Membership, timer_phase
from conveyor.platform.tasks import cancel_and_wait

HEARTBEAT = "heartbeat"
RENEWAL = "renewal"
POLL = "change poll"  # membership version, lease generation: polled while waiting
REBALANCE = "rebalance read"
GRANT = "acquire/release"
CATEGORIES = (HEARTBEAT, RENEWAL, POLL, REBALANCE, GRANT)

_POLL_S = 0.2  # RedisMembership.wait_changed
_SHA = 40
_encode = msgspec.json.Encoder().encode


def _bulk(size: int) -> int:
    """RESP bulk string of ``size`` bytes: ``$<size>\\r\\n<data>\\r\\n``."""
    return len(str(size)) + 3 + size + 2


def _array(count: int) -> int:
    return len(str(count)) + 3


def _int_reply(value: int) -> int:
    return len(str(value)) + 3


def _evalsha(keys: list[str], args: list[str]) -> int:
    """Request bytes of ``EVALSHA <sha> <numkeys> keys... args...``."""
    parts = [7, _SHA, len(str(len(keys)))] + [len(k) for k in keys] + [len(a) for a in args]
    return _array(len(parts)) + sum(_bulk(p) for p in parts)


@dataclass
class Traffic:
    """Operations and bytes (request + reply) per category, and ops per time bucket."""

    bucket_s: float = 0.1
    ops: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    keys: Counter[str] = field(default_factory=Counter)
    """Keys read or written (an MGET of 4,096 leases is one op and 4,096 keys)."""
    buckets: Counter[int] = field(default_factory=Counter)
    byte_buckets: Counter[int] = field(default_factory=Counter)

    def add(self, now: float, category: str, nbytes: int, keys: int = 1) -> None:
        self.ops[category] += 1
        self.bytes[category] += nbytes
        self.keys[category] += keys
        bucket = int(now / self.bucket_s)
        self.buckets[bucket] += 1
        self.byte_buckets[bucket] += nbytes


class SimStore:
    """The shared state of one app's membership and leases, on the loop's clock."""

    def __init__(self, total_queues: int, *, group: str = "sim", rtt_s: float = 0.0005,
                 member_ttl_s: float = 3.0, heartbeat_s: float = 1.0) -> None:
        self.total_queues = total_queues
        self.rtt_s = rtt_s
        self.member_ttl_s = member_ttl_s
        self.heartbeat_s = heartbeat_s
        self.traffic = Traffic()
        app = f"conveyor:app:{group}"
        self.members_keys = [f"{app}:members", f"{app}:member-info", f"{app}:members-version"]
        self.lease_keys = [f"{app}:lease:{q}" for q in range(total_queues)]
        self.fence_keys = [f"{app}:fence:{q}" for q in range(total_queues)]
        self.generation_key = f"{app}:leases-generation"
        self.generation = 0
        self._mget_request = _array(1 + total_queues) + _bulk(4) + sum(
            _bulk(len(k)) for k in self.lease_keys)
        # member id -> (expiry, record, its bytes in a MEMBERS reply)
        self._members: dict[str, tuple[float, MemberInfo, int]] = {}
        self._view: tuple[list[MemberInfo], int] | None = None  # members, reply bytes
        self._view_index: dict[str, int] = {}
        self._ids: tuple[list[str], int] | None = None  # ids, MEMBER_IDS reply bytes
        self._soonest = float("inf")  # no member lapses before this
        self.version = 0
        self._leases: dict[int, tuple[str, int, float]] = {}  # queue -> owner, token, expiry
        self._tokens: dict[int, int] = {}
        self._owners: tuple[dict[int, str], int] | None = None  # owners, MGET reply bytes
        self._owners_until = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def call(self, category: str, nbytes: int, keys: int = 1) -> None:
        """Count one round trip and wait its time (the state changed when it was sent)."""
        self.traffic.add(self.now(), category, nbytes, keys)
        if self.rtt_s > 0:
            await asyncio.sleep(self.rtt_s)

    # -- membership (MEMBER_PUT, MEMBERS, MEMBER_IDS, MEMBERS_VERSION) ----------------
    def _prune(self) -> None:
        """What every membership script does first: drop lapsed members (and count a
        change of the ids)."""
        now = self.now()
        if now < self._soonest:
            return
        gone = [i for i, (exp, _, _) in self._members.items() if exp <= now]
        for ident in gone:
            del self._members[ident]
        if gone:
            self._changed()
        self._soonest = min((exp for exp, _, _ in self._members.values()),
                            default=float("inf"))

    def _changed(self) -> None:
        self.version += 1
        self._view = None
        self._ids = None

    def put_member(self, member: MemberInfo | None, member_id: str) -> int:
        """MEMBER_PUT; returns its request + reply bytes."""
        self._prune()
        if member is None:
            if self._members.pop(member_id, None) is not None:
                self._changed()
            return _evalsha(self.members_keys, [member_id, "", ""]) + _int_reply(0)
        info = _encode(member).decode()
        ttl_ms = str(int(self.member_ttl_s * 1000))
        size = _bulk(len(member_id)) + _bulk(len(info))
        old = self._members.get(member_id)
        expiry = self.now() + self.member_ttl_s
        self._members[member_id] = (expiry, member, size)
        self._soonest = min(self._soonest, expiry)
        if old is None:
            self._changed()
        elif self._view is not None:  # a heartbeat: same ids, one record replaced
            members, reply = self._view
            members[self._view_index[member_id]] = member
            self._view = (members, reply - old[2] + size)
        return _evalsha(self.members_keys, [member_id, info, ttl_ms]) + _int_reply(1)

    def read_members(self) -> tuple[list[MemberInfo], int]:
        """MEMBERS: the live members by id, and the bytes."""
        self._prune()
        if self._view is None:
            live = sorted(self._members.items())
            reply = _array(1 + 2 * len(live)) + sum(size for _, (_, _, size) in live)
            self._view = ([m for _, (_, m, _) in live], reply)
            self._view_index = {ident: i for i, (ident, _) in enumerate(live)}
        members, reply = self._view
        return members, _evalsha(self.members_keys, []) + reply + _int_reply(self.version)

    def read_ids(self) -> tuple[int, list[str], int]:
        """MEMBER_IDS: the version, the live ids, and the bytes."""
        self._prune()
        if self._ids is None:
            ids = sorted(self._members)
            self._ids = (ids, _array(1 + len(ids)) + sum(_bulk(len(i)) for i in ids))
        ids, reply = self._ids
        return self.version, ids, _evalsha(self.members_keys, []) + reply + _int_reply(
            self.version)

    def read_version(self) -> tuple[int, int]:
        """MEMBERS_VERSION: the version, and the bytes."""
        self._prune()
        return self.version, _evalsha(self.members_keys, []) + _int_reply(self.version)

    # -- leases (LEASE_ACQUIRE, LEASE_RENEW, LEASE_RELEASE, MGET, GET generation) -----
    def acquire(self, queue: int, owner: str, ttl_s: float) -> tuple[int, float, int]:
        """(token or 0, ms left on the other owner's lease, bytes)."""
        now = self.now()
        request = _evalsha([self.lease_keys[queue], self.fence_keys[queue],
                            self.generation_key], [owner, str(int(ttl_s * 1000))])
        held = self._leases.get(queue)
        if held is not None and held[2] > now and held[0] != owner:
            pttl = int((held[2] - now) * 1000)
            return 0, pttl, request + _array(2) + _int_reply(0) + _int_reply(pttl)
        token = self._tokens.get(queue, 0) + 1
        self._tokens[queue] = token
        self._leases[queue] = (owner, token, now + ttl_s)
        self._owners = None
        self.generation += 1
        return token, 0.0, request + _array(1) + _int_reply(token)

    def renew(self, lease: Lease, ttl_s: float) -> tuple[bool, int]:
        now = self.now()
        request = _evalsha([self.lease_keys[lease.queue]],
                           [f"{lease.token} {lease.owner}", str(int(ttl_s * 1000))])
        held = self._leases.get(lease.queue)
        if held is None or held[1] != lease.token or held[2] <= now:
            return False, request + _int_reply(0)
        self._leases[lease.queue] = (lease.owner, lease.token, now + ttl_s)
        return True, request + _int_reply(1)

    def release(self, lease: Lease) -> tuple[bool, int]:
        request = _evalsha([self.lease_keys[lease.queue], self.generation_key],
                           [f"{lease.token} {lease.owner}"])
        held = self._leases.get(lease.queue)
        if held is not None and held[1] == lease.token and held[2] > self.now():
            del self._leases[lease.queue]
            self._owners = None
            self.generation += 1
            return True, request + _int_reply(1)
        return False, request + _int_reply(0)

    def owners(self) -> tuple[dict[int, str], int]:
        """MGET of every lease key: the live holders, and the bytes."""
        now = self.now()
        if self._owners is None or now >= self._owners_until:
            owners: dict[int, str] = {}
            reply = _array(self.total_queues)
            until = float("inf")
            for queue in range(self.total_queues):
                held = self._leases.get(queue)
                if held is None or held[2] <= now:
                    reply += 5  # $-1\r\n
                    continue
                owners[queue] = held[0]
                reply += _bulk(len(f"{held[1]} {held[0]}"))
                until = min(until, held[2])
            self._owners = (owners, reply)
            self._owners_until = until
        owners, reply = self._owners
        return owners, self._mget_request + reply

    def read_generation(self) -> tuple[int, int]:
        """GET of the leases' generation: its value, and the bytes."""
        request = _array(2) + _bulk(3) + _bulk(len(self.generation_key))
        return self.generation, request + _bulk(len(str(self.generation)))


class SimMembership(Membership):
    """One daemon's :class:`RedisMembership`, against a :class:`SimStore`."""

    def __init__(self, store: SimStore) -> None:
        self._store = store
        self._me: MemberInfo | None = None
        self._beating: asyncio.Task[None] | None = None
        self._last_version: int | None = None

    async def _write(self, member: MemberInfo | None, member_id: str) -> None:
        await self._store.call(HEARTBEAT, self._store.put_member(member, member_id))

    async def join(self, member: MemberInfo) -> None:
        self._me = member
        await self._write(member, member.id)
        if self._beating is None or self._beating.done():
            self._beating = asyncio.create_task(self._heartbeat_loop())

    async def leave(self, member_id: str) -> None:
        if self._me is not None and self._me.id == member_id:
            self._me = None
            await self.close()
        await self._write(None, member_id)

    async def heartbeat(self, member: MemberInfo) -> None:
        if self._me is not None and self._me.id == member.id:
            self._me = member
            if self._beating is not None and not self._beating.done():
                return  # goes out with the next beat
        await self._write(member, member.id)

    async def _heartbeat_loop(self) -> None:
        # The first beat comes early by this daemon's phase: out of step with the others.
        phase = timer_phase(self._me.id) if self._me is not None else 1.0
        delay_s = self._store.heartbeat_s * phase
        while self._me is not None:
            await asyncio.sleep(delay_s)
            delay_s = self._store.heartbeat_s
            me = self._me
            if me is None:
                return
            await self._write(me, me.id)

    async def members(self) -> list[MemberInfo]:
        members, nbytes = self._store.read_members()
        version = self._store.version
        await self._store.call(REBALANCE, nbytes, keys=len(members) + 1)
        self._last_version = version
        return members

    async def member_ids(self) -> list[str]:
        version, ids, nbytes = self._store.read_ids()
        await self._store.call(REBALANCE, nbytes, keys=2)
        self._last_version = version
        return ids

    async def _version(self, category: str) -> int:
        version, nbytes = self._store.read_version()
        await self._store.call(category, nbytes, keys=2)
        self._last_version = version
        return version

    async def version(self) -> int:
        return await self._version(REBALANCE)

    async def wait_changed(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        before = self._last_version
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(_POLL_S, left))
            if before is None or await self._version(POLL) != before:
                return True

    async def close(self) -> None:
        if self._beating is not None:
            await cancel_and_wait(self._beating)
            self._beating = None


class SimLeaseStore(LeaseStore):
    """One daemon's :class:`RedisLeaseStore`, against a :class:`SimStore`."""

    def __init__(self, store: SimStore) -> None:
        self._store = store
        self._blocked_until: dict[int, float] = {}

    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        started = self._store.now()
        token, pttl_ms, nbytes = self._store.acquire(queue, owner, ttl_s)
        await self._store.call(GRANT, nbytes, keys=2)
        if token == 0:
            self._blocked_until[queue] = started + max(pttl_ms, 0) / 1000
            return None
        self._blocked_until.pop(queue, None)
        return Lease(queue, owner, token, started + ttl_s)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        started = self._store.now()
        ok, nbytes = self._store.renew(lease, ttl_s)
        await self._store.call(RENEWAL, nbytes)
        if not ok:
            return None
        return Lease(lease.queue, lease.owner, lease.token, started + ttl_s)

    async def release(self, lease: Lease) -> bool:
        released, nbytes = self._store.release(lease)
        await self._store.call(GRANT, nbytes)
        return released

    async def owners(self) -> dict[int, str]:
        owners, nbytes = self._store.owners()
        await self._store.call(REBALANCE, nbytes, keys=self._store.total_queues)
        return owners

    async def _generation(self, category: str) -> int:
        generation, nbytes = self._store.read_generation()
        await self._store.call(category, nbytes)
        return generation

    async def generation(self) -> int:
        return await self._generation(REBALANCE)

    async def wait_released(self, timeout_s: float) -> None:
        now = self._store.now()
        due = [t for t in self._blocked_until.values() if t > now]
        wait_s = max(min([timeout_s, *(t - now + 0.02 for t in due)]), 0.0)
        if not due and self._blocked_until:
            wait_s = min(timeout_s, 0.05)
            self._blocked_until.clear()
        if not due:
            await asyncio.sleep(wait_s)
            return
        deadline = now + wait_s
        before = await self._generation(POLL)
        while (left := deadline - self._store.now()) > 0:
            await asyncio.sleep(min(_POLL_S, left))
            if await self._generation(POLL) != before:
                return
