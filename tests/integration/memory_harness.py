"""In-process harness: daemons on a private memory broker, and a recording app."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from conveyor import App, Client, Config, MessageContext, Publish, WorkerDaemon, load_config
from conveyor.adapters.memory import MemoryAdapter, reset_broker


class Item(msgspec.Struct):
    seq: int
    fail: int = 0  # fail this many attempts before succeeding (-1: always)


@dataclass
class Record:
    calls: Counter[str] = field(default_factory=Counter)
    order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    active: int = 0
    max_active: int = 0

    @property
    def handled(self) -> int:
        return len(self.calls)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.calls.values())


def recording_app(
    record: Record, delay_s: float | tuple[float, float] = 0.0, name: str = "test"
) -> App:
    app = App(name)
    attempts: Counter[str] = Counter()

    @app.handler("items", retry_attempts=3, retry_delay_s=0.001)
    async def handle(item: Item, ctx: MessageContext) -> None:
        msg_id = ctx.message.id
        if item.fail and (item.fail < 0 or attempts[msg_id] < item.fail):
            attempts[msg_id] += 1
            raise ValueError(f"item {item.seq} failed on purpose")
        record.active += 1
        record.max_active = max(record.max_active, record.active)
        try:
            if isinstance(delay_s, tuple):
                await asyncio.sleep(random.uniform(*delay_s))
            elif delay_s:
                await asyncio.sleep(delay_s)
        finally:
            record.active -= 1
        record.order[ctx.message.stream.key].append(item.seq)
        record.calls[msg_id] += 1

    return app


def config(**sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {"memory": {"broker": "it"}}
    overrides.update(sections)
    return load_config(environ={}, overrides=overrides)


def fresh_adapter() -> MemoryAdapter:
    reset_broker("it")
    return MemoryAdapter("it")


async def publish_items(
    client: Client, n: int, streams: int, fail: dict[int, int] | None = None
) -> list[str]:
    """Publish items 0..n-1 round-robin over streams; returns message ids in order."""
    fail = fail or {}
    ids: list[str] = []
    items = [Publish("items", f"s{i % streams}", Item(i, fail.get(i, 0))) for i in range(n)]
    msgs = [client.build(p.namespace, p.key, p.body) for p in items]
    for m in msgs:
        await client.adapter.enqueue(client.mapper.queue_for(m.stream), [m])
        ids.append(m.id)
    return ids


def daemon(app: App, adapter: MemoryAdapter, cfg: Config | None = None, **kw: Any) -> WorkerDaemon:
    return WorkerDaemon(app, cfg or config(), adapter=adapter, **kw)
