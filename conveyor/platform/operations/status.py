"""What ``conveyor status`` shows: members, queue owners and lag, read from the stores,
and every app's consumer group on the queues (:mod:`conveyor.platform.operations.groups`).

Members and owners come from where the balancer keeps them: the membership and lease
stores (``dynamic``, ``static``), or, for a balancer a backend brings that keeps none
of its own (``kafka-group``), that balancer's member source (Kafka: the group
coordinator and the daemons' reports). Which is which comes with the
:class:`~conveyor.platform.backend.Backend` the caller hands in.

Throughput comes from the owners' heartbeats, never from the reader's clock: each
daemon publishes its per-queue ack counts with the time it took them (``at``) and the
acks per second it measured itself (:class:`AckRates`). A heartbeat lands every
``lease_ttl_s / 3``; reading faster than that sees the same heartbeat again, which
yields no new rate rather than a false zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from conveyor.platform.adapter import QueueAdapter, StoreProblem, first_named
from conveyor.platform.backend import Backend
from conveyor.platform.balancing.leases import LeaseStore
from conveyor.platform.balancing.membership import MemberInfo, Membership
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, StoreUnfitError
from conveyor.platform.ids import is_app_name
from conveyor.platform.operations.groups import GroupStatus, summarise

MEASURES = ("at", "cpu_percent")
"""Heartbeat stats that are measures (kept as floats, as are ``*_s`` and ``*_per_s``);
every other one is a count or a size in bytes."""


def typed_stats(stats: Mapping[str, float]) -> dict[str, float]:
    """A heartbeat's stats with counts and sizes as integers (the membership record
    carries every figure as a float; filtered memory sizes have fractions of a byte)."""
    return {key: value if key in MEASURES or key.endswith("_s") else round(value)
            for key, value in stats.items()}


@dataclass(frozen=True)
class QueueStatus:
    queue: int
    owner: str | None
    lag: int
    cache_fill: int | None = None
    """Messages its agent holds, from the owner's last heartbeat, and at most ``lag``:
    what an agent holds is pulled and not acknowledged, which every backend's lag
    counts, so a heartbeat's figure above the lag read now is older than the drain that
    emptied the queue (shown as the lag until the next heartbeat)."""
    acked: int | None = None
    """Messages its agent acknowledged since it took the queue (owner's last heartbeat)."""
    acks_per_s: float | None = None
    """Acks per second the owner measured between its last two heartbeats."""
    at: float | None = None
    """When the owner took ``acked`` (its clock, published with the heartbeat)."""
    appended: int | None = None
    """Messages ever appended to the queue (:attr:`GroupInfo.appended`), as read now."""


@dataclass(frozen=True)
class MemberStatus:
    id: str
    host: str
    pid: int
    stats: dict[str, float]
    queues: list[int] = field(default_factory=list)
    """The queues it owns."""
    version: str = ""
    """Its Conveyor version; ``""`` when its record does not say (an older daemon)."""
    started_at: float = 0.0
    """When it started (its clock); 0 when unknown."""


@dataclass(frozen=True)
class StatusReport:
    group: str
    members: list[MemberStatus]
    queues: list[QueueStatus] = field(default_factory=list)
    at: float = 0.0
    groups: list[GroupStatus] = field(default_factory=list)
    """Every app's group on the queues, this one's included (when it has one)."""
    retention_follows_groups: bool = True
    """False where retention goes by time or size alone (Kafka): no group holds it."""
    dead_letters: int | None = None
    """The app's dead letters in the store (``conveyor dlq list`` lists them)."""
    eviction_policy: str | None = None
    """What the broker deletes when full (Redis: ``maxmemory-policy``; anything but
    ``noeviction`` loses messages); None where it deletes nothing."""
    persistence: str | None = None
    """What the broker keeps across a restart (Redis: ``aof``, ``rdb``, ``none`` — a
    restart loses every message — or ``unknown``; each server's where they differ);
    None where the question does not arise (Kafka)."""
    beyond_total: dict[int, int] = field(default_factory=dict)
    """Messages on queues past ``[queues] total``, per queue that holds any
    (:meth:`QueueAdapter.entries_beyond`): no daemon of this config reads them."""
    store_problems: list[StoreProblem] = field(default_factory=list)
    """The queues' and the app's dead-letter stores that hold something else or are set
    to delete (:meth:`QueueAdapter.store_problems`)."""

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @property
    def has_group(self) -> bool:
        """Whether the app has a consumer group on any queue (else its figures are
        those of an app that never ran: perhaps a typo)."""
        return any(g.group == self.group for g in self.groups)

    def rates(self, previous: StatusReport | None = None) -> dict[int, float]:
        """Acks per second per queue.

        Over the heartbeats seen in ``previous`` and here when the owner is the same
        and has heartbeated since (a longer, steadier window than the owner's own);
        else the rate the owner published; absent when neither is known.
        """
        before = {q.queue: q for q in previous.queues} if previous is not None else {}
        out: dict[int, float] = {}
        for q in self.queues:
            old = before.get(q.queue)
            if (old is not None and old.owner == q.owner and q.acked is not None
                    and old.acked is not None and q.at is not None and old.at is not None
                    and q.at > old.at and q.acked >= old.acked):
                out[q.queue] = (q.acked - old.acked) / (q.at - old.at)
            elif q.acks_per_s is not None:
                out[q.queue] = q.acks_per_s
        return out


class AckRates:
    """Per-queue acks per second between a daemon's stats snapshots (its heartbeats).

    Snapshots closer together than ``min_window_s`` repeat the last rates instead of
    dividing by a few milliseconds; a queue whose count went down (taken over and back)
    starts a new window.
    """

    def __init__(self, min_window_s: float = 0.5) -> None:
        self.min_window_s = min_window_s
        self._since: dict[int, tuple[int, float]] = {}
        self._rates: dict[int, float] = {}

    def sample(self, acked: Mapping[int, int], now: float) -> dict[int, float]:
        rates: dict[int, float] = {}
        since: dict[int, tuple[int, float]] = {}
        for queue, count in acked.items():
            start = self._since.get(queue)
            if start is None or count < start[0]:
                since[queue] = (count, now)
            elif now - start[1] < self.min_window_s:
                since[queue] = start
                if queue in self._rates:
                    rates[queue] = self._rates[queue]
            else:
                since[queue] = (count, now)
                rates[queue] = (count - start[0]) / (now - start[1])
        self._since, self._rates = since, rates
        return rates


def _closers(stores: tuple[Membership, LeaseStore]) -> list[Callable[[], Awaitable[None]]]:
    membership, leases = stores
    return [membership.close, leases.close]  # the lease store owns what they share


async def _close_all(closers: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Call each, in order, whatever the others raise (the first error is raised)."""
    async with contextlib.AsyncExitStack() as stack:
        for close in reversed(closers):
            stack.push_async_callback(close)


class StatusReader:
    """What a reading reaches the broker through: the queue adapter, and each app's
    membership and lease stores where the balancer keeps them (``dynamic``, ``static``),
    each opened on first use and kept until :meth:`close`.

    One reading opens and closes a reader of its own (:func:`collect_status`,
    :func:`collect_apps`); a reading repeated every few seconds (the console) keeps one,
    so that it does not connect, read the cluster's metadata and disconnect again for
    every app at every reading. After a failed reading the caller closes it and reads
    through a new one: a client left half-broken by the failure is not reused."""

    def __init__(self, config: Config, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self._adapter: QueueAdapter | None = None
        self._stores: dict[str, tuple[Membership, LeaseStore]] = {}

    @property
    def adapter(self) -> QueueAdapter:
        if self._adapter is None:
            self._adapter = self.backend.adapter(self.config)
        return self._adapter

    async def close(self) -> None:
        """Close everything it opened (each, whatever the others raise); a later reading
        opens anew."""
        adapter, stores = self._adapter, list(self._stores.values())
        self._adapter, self._stores = None, {}
        await _close_all([*([adapter.close] if adapter is not None else []),
                          *(close for pair in stores for close in _closers(pair))])

    async def forget(self, keep: Collection[str]) -> None:
        """Close the stores of the apps not in ``keep`` (their groups gone since)."""
        gone = [self._stores.pop(g) for g in [*self._stores] if g not in keep]
        await _close_all([close for pair in gone for close in _closers(pair)])

    def _coordination(self, group: str) -> tuple[Membership, LeaseStore]:
        stores = self._stores.get(group)
        if stores is None:
            if self.backend.coordination is None:
                raise ConfigError(f"$.balancer.membership: the {self.backend.name!r} backend "
                                  "keeps no membership")
            stores = self._stores[group] = self.backend.coordination(self.config, group)
        return stores

    async def members_and_owners(self, group: str) -> tuple[list[MemberInfo], dict[int, str]]:
        kind = self.backend.balancer(self.config.balancer.kind)
        if kind is not None:
            found = await kind.members(self.adapter, group)
            return ([m.info for m in found],
                    {q: m.info.id for m in found for q in m.queues})
        membership, leases = self._coordination(group)
        return await membership.members(), await leases.owners()

    async def status(self, group: str, *, look_beyond: bool = True,
                     look_stores: bool = True) -> StatusReport:
        """App ``group``'s report, as :func:`collect_status` says."""
        config, adapter = self.config, self.adapter
        members, owners = await self.members_and_owners(group)
        stats = {m.id: typed_stats(m.stats) for m in members}
        infos = await adapter.groups.on(range(config.queues.total))
        appended = {i.queue: i.appended for i in infos if i.appended is not None}
        queues = []
        # At once: on Kafka each lag waits for a fetch response (~0.1-0.2 s on tansu).
        lags = await asyncio.gather(*(adapter.lag(q, group)
                                      for q in range(config.queues.total)))
        for q, lag in enumerate(lags):
            owner = owners.get(q)
            own = stats.get(owner or "", {})
            fill = own.get(f"queue.{q}.cache_fill")
            acked = own.get(f"queue.{q}.acked")
            queues.append(QueueStatus(
                q, owner, lag,
                None if fill is None else min(int(fill), lag),
                None if acked is None else int(acked),
                own.get(f"queue.{q}.acks_per_s"), own.get("at"), appended.get(q),
            ))
        groups = summarise(infos)
        dead_letters = await adapter.dead_letters.count(group)
        eviction = await adapter.eviction_policy()
        persistence = await adapter.persistence()
        beyond = await adapter.entries_beyond(config.queues.total) if look_beyond else {}
        problems = (await adapter.store_problems(range(config.queues.total), [group])
                    if look_stores else [])
        owned: dict[str, list[int]] = {}
        for q, owner in sorted(owners.items()):
            owned.setdefault(owner, []).append(q)
        return StatusReport(
            group,
            [MemberStatus(m.id, m.host, m.pid, stats[m.id], owned.get(m.id, []), m.version,
                          m.started_at) for m in members],
            queues, time.time(), groups, adapter.groups.retention_follows_groups, dead_letters,
            eviction, persistence, beyond, problems,
        )

    async def apps(self, *, look_beyond: bool = True, look_stores: bool = True) -> AppsReport:
        """Every app's summary, as :func:`collect_apps` says."""
        config, adapter = self.config, self.adapter
        groups = summarise(await adapter.groups.on(range(config.queues.total)))
        apps = []
        unfit: list[StoreProblem] = []
        for g in groups:
            if not is_app_name(g.group):  # another tool's group: no app has its name, so
                # it has no daemons or letters to look up (and no keys to name them by)
                apps.append(AppSummary(g.group, None, g.queues, g.lag, g.idle_s, None,
                                       g.holds_retention))
                continue
            daemons = None
            if config.balancer.kind != "static":
                try:
                    members, _ = await self.members_and_owners(g.group)
                    daemons = len(members)
                except StoreUnfitError as exc:  # its membership unreadable: the others'
                    unfit.append(StoreProblem(  # still are (its daemons shown unknown)
                        f"app {g.group!r}'s membership", f"app {g.group!r}'s daemons",
                        "another type", str(exc)))
            apps.append(AppSummary(g.group, daemons, g.queues, g.lag, g.idle_s,
                                   await adapter.dead_letters.count(g.group),
                                   g.holds_retention))
        eviction = await adapter.eviction_policy()
        persistence = await adapter.persistence()
        beyond = await adapter.entries_beyond(config.queues.total) if look_beyond else {}
        problems = unfit + (await adapter.store_problems(
            range(config.queues.total), [a.app for a in apps if is_app_name(a.app)],
            every_app=True) if look_stores else [])
        return AppsReport(apps, adapter.groups.retention_follows_groups, time.time(), eviction,
                          persistence, beyond, problems)


async def collect_status(config: Config, group: str, backend: Backend, *,
                         look_beyond: bool = True, look_stores: bool = True) -> StatusReport:
    """App ``group``'s members, queues and figures, read through ``backend`` (what
    ``config`` runs on: ``conveyor.backends.for_config``). ``look_beyond``: read the
    queues past the total too (:attr:`StatusReport.beyond_total`; on Redis one pipeline of
    an ``XLEN`` per queue up to 4,096), and ``look_stores``: check the stores
    (:attr:`StatusReport.store_problems`; on Kafka an admin client and a DescribeConfigs
    per letter topic), which a reading repeated every second (the console, ``--watch``)
    skips."""
    reader = StatusReader(config, backend)
    try:
        return await reader.status(group, look_beyond=look_beyond, look_stores=look_stores)
    finally:
        await reader.close()


@dataclass(frozen=True)
class AppSummary:
    """One app found on the queues (a consumer group): a row of ``conveyor status``."""

    app: str
    daemons: int | None
    """Running daemons: registered in the membership store (or in Kafka's group);
    None where daemons register nowhere (``static`` balancer)."""
    queues: list[int]
    """Queues it has a position on."""
    lag: int
    idle_s: float | None
    """Since one of its consumers last read any queue (Redis); None: never or unknown."""
    dead_letters: int | None
    holds_retention: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class AppsReport:
    """Every app on the queues: what ``conveyor status`` shows without ``--app``."""

    apps: list[AppSummary]
    retention_follows_groups: bool
    at: float
    eviction_policy: str | None = None
    """As :attr:`StatusReport.eviction_policy`."""
    persistence: str | None = None
    """As :attr:`StatusReport.persistence`."""
    beyond_total: dict[int, int] = field(default_factory=dict)
    """As :attr:`StatusReport.beyond_total`."""
    store_problems: list[StoreProblem] = field(default_factory=list)
    """As :attr:`StatusReport.store_problems`, the dead letters of every app listed."""


async def collect_apps(config: Config, backend: Backend, *,
                       look_beyond: bool = True, look_stores: bool = True) -> AppsReport:
    """Every app with a consumer group on the queues, with its daemons, lag and letters,
    read through ``backend`` (as :func:`collect_status`, ``look_beyond`` and
    ``look_stores`` too: the stores every app shares are checked even where no app has a
    group yet)."""
    reader = StatusReader(config, backend)
    try:
        return await reader.apps(look_beyond=look_beyond, look_stores=look_stores)
    finally:
        await reader.close()


def broker_warnings(config: Config, eviction_policy: str | None, persistence: str | None,
                    beyond_total: Mapping[int, int],
                    store_problems: Sequence[StoreProblem] = ()) -> list[str]:
    """What a status reading says of the broker that can cost messages: a Redis that
    evicts or forgets on restart, entries on queues past ``[queues] total``, a queue's
    or dead-letter store that holds something else or is set to delete
    (:meth:`QueueAdapter.store_problems`). One line each; ``conveyor status`` prints
    them as warnings (the exit status stays 0), the console shows them."""
    warnings = [p.warning for p in store_problems]
    if eviction_policy not in (None, "noeviction"):
        accepted = ("accepted by [redis] allow_eviction = true" if config.redis.allow_eviction
                    else "workers refuse it unless [redis] allow_eviction = true")
        warnings.append(f"Redis maxmemory-policy is {eviction_policy}: a full server deletes "
                        f"messages and leases ({accepted}; docs/redis.md, \"Eviction policy\")")
    if (lost := _restart_loses(persistence)) is not None:
        warnings.append(f"Redis persistence is {persistence}{lost} "
                        "(docs/redis.md, \"Persistence\")")
    if beyond_total:  # a daemon's start says the same (docs/redis.md, "Wire format")
        counts = first_named([f"queue {q}: {n:,}" for q, n in sorted(beyond_total.items())],
                             "queues")
        warnings.append(
            f"queues past [queues] total = {config.queues.total} hold "
            f"{sum(beyond_total.values()):,} entries ({counts}): a producer with a larger "
            "total put them where no daemon of this config reads; every producer and daemon "
            "of an app must use the same total")
    return warnings


def records_lost(stats: Mapping[str, float]) -> list[tuple[int, int]]:
    """``(queue, count)`` of the records the broker deleted before they were handled, as
    a daemon's heartbeat ``stats`` count them (``queue.N.lost``: a Kafka retention that
    ran ahead of the app, docs/kafka.md)."""
    return [(int(key.split(".")[1]), int(lost)) for key, lost in sorted(stats.items())
            if key.startswith("queue.") and key.endswith(".lost") and lost]


def lost_line(daemon: str, queue: int, count: int) -> str:
    """How ``conveyor status`` and the console say one of :func:`records_lost`."""
    return (f"{daemon}: queue {queue}: {count:,} message(s) deleted by the broker before "
            "being handled")


def _restart_loses(persistence: str | None) -> str | None:
    """Why, and what a restart loses, where the reading is ``none`` or ``unknown`` (on
    some server of a cluster: ``host:port=none, …``); None where the server keeps its
    messages (``aof``) or most of them (``rdb``: not warned about, docs/redis.md says
    why)."""
    if persistence is None:
        return None
    readings = {part.rsplit("=", 1)[-1] for part in persistence.split(", ")}
    if not readings & {"none", "unknown"}:
        return None
    if readings == {"none"}:
        return (' (save "", appendonly no): a restart loses every queued and pending '
                "message")
    if readings == {"unknown"}:
        return (" (CONFIG GET refused, INFO shows no AOF): unless the server snapshots, a "
                "restart loses every queued and pending message")
    return ": a restart of a server at none (or unknown) loses every message it holds"
