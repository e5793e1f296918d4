"""Where daemons meet: the membership and lease stores a config names.

Built lazily by name, like adapters, so ``platform`` imports no driver.
"""

from __future__ import annotations

from typing import Any

from conveyor.platform.balancing.balancer import local_coordination
from conveyor.platform.balancing.leases import LeaseStore
from conveyor.platform.balancing.membership import Membership
from conveyor.platform.errors import ConfigError
from conveyor.platform.importing import load_attr

_BUILTIN = {
    "memory": "conveyor.platform.balancing.coordination:memory_coordination",
    "redis": "conveyor.adapters.redis.coordination:redis_coordination",
}


def memory_coordination(config: Any, group: str) -> tuple[Membership, LeaseStore]:
    return local_coordination(f"{config.memory.broker}/{group}")


def coordination_from_config(config: Any, group: str) -> tuple[Membership, LeaseStore]:
    name = config.balancer.membership
    target = _BUILTIN.get(name)
    if target is None:
        raise ConfigError(
            f"unknown membership store {name!r} at $.balancer.membership "
            f"(choose one of {sorted(_BUILTIN)})"
        )
    factory = load_attr(target, f"$.balancer.membership = {name!r}")
    result: tuple[Membership, LeaseStore] = factory(config, group)
    return result


async def lease_owners(config: Any, group: str) -> dict[int, str]:
    """Who holds each leased queue of app ``group`` in the configured lease store.

    What an adapter cannot see for itself (a Kafka app under the dynamic balancer keeps
    its leases in Redis): ``conveyor rewind`` passes it to ``rewind_queues``. The memory
    store answers for the daemons of this process only.
    """
    membership, leases = coordination_from_config(config, group)
    try:
        return await leases.owners()
    finally:
        await membership.close()
        await leases.close()
