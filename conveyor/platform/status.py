"""What ``conveyor status`` shows: members, queue owners and lag, read from the stores."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from conveyor.platform.adapter import create_adapter
from conveyor.platform.config import Config
from conveyor.platform.coordination import coordination_from_config


@dataclass(frozen=True)
class QueueStatus:
    queue: int
    owner: str | None
    lag: int
    cache_fill: int | None = None
    """Messages its agent holds, from the owner's last heartbeat."""
    acked: int | None = None
    """Messages its agent acknowledged since it took the queue (owner's last heartbeat)."""


@dataclass(frozen=True)
class MemberStatus:
    id: str
    host: str
    pid: int
    stats: dict[str, float]


@dataclass(frozen=True)
class StatusReport:
    group: str
    members: list[MemberStatus]
    queues: list[QueueStatus] = field(default_factory=list)
    at: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)

    def rates(self, previous: StatusReport | None) -> dict[int, float]:
        """Acks per second per queue since ``previous`` (same owner only)."""
        if previous is None or self.at <= previous.at:
            return {}
        before = {q.queue: q for q in previous.queues}
        out: dict[int, float] = {}
        for q in self.queues:
            old = before.get(q.queue)
            if old and q.acked is not None and old.acked is not None and old.owner == q.owner:
                out[q.queue] = max(0.0, (q.acked - old.acked) / (self.at - previous.at))
        return out


async def collect_status(config: Config, group: str) -> StatusReport:
    membership, leases = coordination_from_config(config, group)
    adapter = create_adapter(config.queues.adapter, config)
    try:
        members = await membership.members()
        owners = await leases.owners()
        stats = {m.id: m.stats for m in members}
        queues = []
        for q in range(config.queues.total):
            owner = owners.get(q)
            own = stats.get(owner or "", {})
            fill = own.get(f"queue.{q}.cache_fill")
            acked = own.get(f"queue.{q}.acked")
            queues.append(QueueStatus(
                q, owner, await adapter.lag(q, group),
                None if fill is None else int(fill), None if acked is None else int(acked),
            ))
    finally:
        await adapter.close()
        await membership.close()
        await leases.close()
    return StatusReport(
        group, [MemberStatus(m.id, m.host, m.pid, dict(m.stats)) for m in members], queues,
        time.time(),
    )
