"""Kafka's offer to Conveyor (:data:`BACKEND`): the adapter, and the ``kafka-group``
balancer (Kafka's consumer-group protocol) with its member source for ``conveyor status``.

Kafka keeps no leases, membership, idempotency keys or rate bucket of its own: a Kafka
app under the ``dynamic`` balancer keeps its leases where ``[balancer] membership``
says, and its idempotency keys and shared rate bucket in Redis (``conveyor.backends``
combines them).
"""

from __future__ import annotations

from conveyor.adapters.kafka.adapter import for_commands, from_config
from conveyor.adapters.kafka.group_balancer import from_config as group_balancer
from conveyor.adapters.kafka.group_balancer import group_members
from conveyor.platform.backend import Backend, BalancerKind
from conveyor.platform.config import Config


def describe(config: Config) -> str:
    return f"kafka {config.kafka.bootstrap} (topic {config.kafka.topic})"


BACKEND = Backend("kafka", from_config, command_adapter=for_commands,
                  balancers={"kafka-group": BalancerKind(group_balancer, group_members)},
                  describe=describe)
