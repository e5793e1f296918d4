"""What ``conveyor status`` shows: members, queue owners and lag, read from the stores."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.platform.adapter import create_adapter
from conveyor.platform.config import Config
from conveyor.platform.coordination import coordination_from_config


@dataclass(frozen=True)
class QueueStatus:
    queue: int
    owner: str | None
    lag: int


@dataclass(frozen=True)
class StatusReport:
    group: str
    members: list[str]
    queues: list[QueueStatus] = field(default_factory=list)

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


async def collect_status(config: Config, group: str) -> StatusReport:
    membership, leases = coordination_from_config(config, group)
    adapter = create_adapter(config.queues.adapter, config)
    try:
        members = [m.id for m in await membership.members()]
        owners = await leases.owners()
        queues = [
            QueueStatus(q, owners.get(q), await adapter.lag(q, group))
            for q in range(config.queues.total)
        ]
    finally:
        await adapter.close()
    return StatusReport(group, members, queues)
