"""Which broker is which: the one place a backend's name meets its code.

``"memory"``, ``"redis"`` and ``"kafka"`` each name a :class:`~conveyor.platform.backend.
Backend` defined in its own adapter package; :func:`backend` returns it, importing the
package (and its driver) only then, so a command that uses one broker loads no other.
This module sits above ``platform/`` and ``adapters/``: the CLI, the console, the
workers and the testing kit ask it, and hand what it gives them to ``platform/``, which
never names a broker.

A config can draw on more than one broker, so :func:`for_config` combines them once
into the backend that config runs on:

* the queues, and the balancer kinds beyond ``dynamic`` and ``static``, are the queue
  adapter's (``$.queues.adapter``);
* membership and leases are those of ``$.balancer.membership`` (a Kafka app under the
  ``dynamic`` balancer keeps its leases in Redis);
* the shared rate bucket is that of ``$.slots.rate.store``;
* idempotency keys are the queue adapter's where it keeps them (memory, Redis), else in
  Redis at ``[redis] url`` (Kafka: a Kafka deployment with idempotent handlers needs a
  Redis).

Adding a broker: write its adapter package with a ``BACKEND``, pass the contract suite
(``tests/contract``), add its name to the config's ``AdapterName`` and a line to
:data:`_BACKENDS` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.backend import Backend
from conveyor.platform.balancing.leases import LeaseStore
from conveyor.platform.balancing.membership import Membership
from conveyor.platform.config import Config
from conveyor.platform.delivery.idempotency import IdempotencyStore
from conveyor.platform.errors import ConfigError
from conveyor.platform.slots import TokenSource


def _memory() -> Backend:
    from conveyor.adapters.memory import BACKEND

    return BACKEND


def _redis() -> Backend:
    from conveyor.adapters.redis.backend import BACKEND

    return BACKEND


def _kafka() -> Backend:
    from conveyor.adapters.kafka.backend import BACKEND

    return BACKEND


_BACKENDS: dict[str, Callable[[], Backend]] = {
    "memory": _memory,
    "redis": _redis,
    "kafka": _kafka,
}

IDEMPOTENCY_FALLBACK = "redis"
"""Where an app keeps its idempotency keys when its queue adapter keeps none (Kafka)."""


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend(name: str) -> Backend:
    """The backend a config calls ``name``, as the queue adapter (``$.queues.adapter``)."""
    load = _BACKENDS.get(name)
    if load is None:
        raise ConfigError(
            f"unknown adapter {name!r} at $.queues.adapter (choose one of {backend_names()})"
        )
    return load()


def create_adapter(name: str, config: Config) -> QueueAdapter:
    """The queue adapter of backend ``name``, built from ``config``."""
    return backend(name).adapter(config)


def coordination(config: Config, group: str) -> tuple[Membership, LeaseStore]:
    """App ``group``'s membership and lease stores, where ``$.balancer.membership`` says;
    the caller closes both."""
    name = config.balancer.membership
    load = _BACKENDS.get(name)
    found = None if load is None else load().coordination
    if found is None:
        raise ConfigError(
            f"unknown membership store {name!r} at $.balancer.membership "
            f"(choose one of {_membership_names()})"
        )
    return found(config, group)


def _membership_names() -> list[str]:
    """The backends that keep membership (an error's hint: this loads every backend)."""
    return [name for name in backend_names() if _BACKENDS[name]().coordination is not None]


def idempotency_store(config: Config, group: str) -> IdempotencyStore:
    """App ``group``'s idempotency store: its queue adapter's, else Redis's."""
    own = backend(config.queues.adapter).idempotency_store
    factory = own or backend(IDEMPOTENCY_FALLBACK).idempotency_store
    assert factory is not None  # the fallback keeps keys
    return factory(config, group)


def rate_bucket(config: Config, group: str, per_second: float, burst: int) -> TokenSource:
    """App ``group``'s shared bucket in the store ``$.slots.rate.store`` names."""
    store = config.slots.rate.store
    load = _BACKENDS.get(store)
    found = None if load is None else load().rate_bucket
    if found is None:
        raise ConfigError(f"$.slots.rate.store: {store!r} keeps no shared rate bucket "
                          '(use store = "local" for a per-daemon limit)')
    return found(config, group, per_second, burst)


def for_config(config: Config) -> Backend:
    """The backend ``config`` runs on: the queue adapter's, with membership, leases,
    idempotency keys and the rate bucket from where the config keeps them (see the
    module's docstring). The other brokers it names are loaded when first used."""
    queues = backend(config.queues.adapter)
    return dataclasses.replace(queues, coordination=coordination,
                               idempotency_store=idempotency_store, rate_bucket=rate_bucket)


def for_commands(config: Config) -> Backend:
    """:func:`for_config`, for an operator's command (``status``, ``dlq``, ``groups``,
    ``rewind``, the console): its ``adapter`` is the backend's ``command_adapter`` where
    it has one, whose requests wait less for a broker that never answers (a daemon's
    Kafka clients wait aiokafka's 40 s, a command's ``[kafka] command_timeout_ms``)."""
    combined = for_config(config)
    if combined.command_adapter is None:
        return combined
    return dataclasses.replace(combined, adapter=combined.command_adapter)


def command_adapter(config: Config) -> QueueAdapter:
    """The queue adapter of an operator's command (:func:`for_commands`)."""
    queues = backend(config.queues.adapter)
    return (queues.command_adapter or queues.adapter)(config)


async def lease_owners(config: Config, group: str) -> dict[int, str]:
    """Who holds each leased queue of app ``group`` in the configured lease store.

    What an adapter cannot see for itself (a Kafka app under the dynamic balancer keeps
    its leases in Redis): ``conveyor rewind`` passes it to ``rewind_queues``. The memory
    store answers for the daemons of this process only.
    """
    membership, leases = coordination(config, group)
    try:
        return await leases.owners()
    finally:
        await membership.close()
        await leases.close()
