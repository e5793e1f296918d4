"""The backend port: everything one broker brings to Conveyor, in one value.

A :class:`Backend` is a broker's whole offer, as factories that take the platform config:
its queue adapter, the membership and lease stores daemons meet in, the balancer kinds
it adds beside ``dynamic`` and ``static`` (with the member source ``conveyor status``
reads for each), the idempotency store, the shared rate bucket, how operators'
pages name where the queues are, and the adapter operators' commands use where it
differs from a daemon's. A part it does not offer is ``None`` (or absent from
``balancers``).

Each broker's package defines its value beside its drivers; one registry above this
room and the adapters maps the names a config uses (``$.queues.adapter``,
``$.balancer.membership``, ``$.slots.rate.store``) to them and combines them for one
config, once. ``platform/`` never names a broker's module, not even in a string: what
it needs of a backend (``conveyor status``, the daemon's parts) is handed to it as a
:class:`Backend`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.balancing.balancer import QueueBalancer
from conveyor.platform.balancing.leases import LeaseStore
from conveyor.platform.balancing.membership import MemberInfo, Membership
from conveyor.platform.config import Config
from conveyor.platform.delivery.idempotency import IdempotencyStore
from conveyor.platform.errors import ConfigError
from conveyor.platform.slots import TokenSource

PLATFORM_BALANCERS = ("dynamic", "static")
"""The balancer kinds ``platform/`` builds itself, on any backend."""


class OwningMember(Protocol):
    """A daemon as a balancer's member source reports it: who, and the queues it owns."""

    @property
    def info(self) -> MemberInfo: ...

    @property
    def queues(self) -> Sequence[int]: ...


AdapterFactory = Callable[[Config], QueueAdapter]
CoordinationFactory = Callable[[Config, str], tuple[Membership, LeaseStore]]
"""``(config, app) -> (membership, leases)``: the stores of one app; the caller closes both."""
IdempotencyFactory = Callable[[Config, str], IdempotencyStore]
"""``(config, app) -> store`` of the claims and marks of ``idempotent=True`` handlers."""
RateBucketFactory = Callable[[Config, str, float, int], TokenSource]
"""``(config, app, per_second, burst) -> bucket`` shared by every daemon of the app."""
MemberSource = Callable[[QueueAdapter, str], Awaitable[Sequence[OwningMember]]]
"""``async (adapter, app) -> members``: who runs the app, for a balancer that keeps no
membership store of its own."""


@dataclass(frozen=True, slots=True)
class BalancerKind:
    """A balancer a broker brings (``[balancer] kind``): how a daemon builds it, and
    where ``conveyor status`` reads its members and their queues."""

    build: Callable[[Config, str, QueueAdapter], QueueBalancer]
    """``(config, app, adapter) -> balancer``; refuses an adapter of another broker."""
    members: MemberSource


@dataclass(frozen=True, slots=True)
class Backend:
    """One broker's offer. ``name`` is what a config calls it (``"redis"``)."""

    name: str
    adapter: AdapterFactory
    coordination: CoordinationFactory | None = None
    """Membership and leases for the ``dynamic`` balancer (``$.balancer.membership``)."""
    balancers: Mapping[str, BalancerKind] = field(default_factory=dict)
    """Balancer kinds beyond ``dynamic`` and ``static``, by ``$.balancer.kind``."""
    idempotency_store: IdempotencyFactory | None = None
    rate_bucket: RateBucketFactory | None = None
    """The bucket of ``[slots.rate] store`` when it names this broker."""
    describe: Callable[[Config], str] | None = None
    """Where the config's queues are, as operators name it, with no password in it."""
    in_process: bool = False
    """Its queues live inside one process: no other process can share them (the
    embedded broker; ``--processes`` refuses it)."""
    command_adapter: AdapterFactory | None = None
    """The queue adapter of an operator's command (``status``, ``dlq``, ``groups``,
    ``rewind``, the console) where it differs from a daemon's: one whose requests wait
    less for a broker that accepts connections and never answers (the broker's section
    of the config says how long). None: ``adapter``, which bounds a command's wait
    already."""

    def where(self, config: Config) -> str:
        """Where ``config``'s queues are on this backend, safe to show (``describe``)."""
        return self.describe(config) if self.describe is not None else self.name

    def balancer(self, kind: str) -> BalancerKind | None:
        """The balancer ``kind`` (``$.balancer.kind``) names when this backend brings it;
        None for the platform's own (``dynamic``, ``static``)."""
        if kind in PLATFORM_BALANCERS:
            return None
        found = self.balancers.get(kind)
        if found is None:
            raise ConfigError(f"$.balancer.kind: {kind!r} is not offered by the {self.name!r} "
                              f"adapter (it offers {sorted(self.balancers) or 'none'})")
        return found
