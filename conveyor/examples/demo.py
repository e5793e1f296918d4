"""The demo: an example app on the embedded adapter, with a computed summary.

The app records every order it handles, so the summary line is counted from what
really happened, not assumed (:func:`summarize`): from the orders the client published,
the multiset the handler finished and the orders found in the dead-letter queue.
``handled`` counts distinct orders handled, ``duplicates`` every delivery of an order
beyond its first (handled twice, or handled and dead-lettered), ``lost`` orders
published but neither handled nor dead-lettered. Per-stream order is checked too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.platform.config import Config
from conveyor.platform.handlers import MessageContext
from conveyor.workers.daemon import WorkerDaemon


class Order(msgspec.Struct):
    seq: int
    amount_cents: int
    poison: bool = False


@dataclass
class Ledger:
    """What the example app saw."""

    handled: Counter[int] = field(default_factory=Counter)
    """Order number to how many times the handler finished it."""
    last_seq: dict[str, int] = field(default_factory=dict)
    out_of_order: int = 0
    total_cents: int = 0


def build_app(ledger: Ledger, work_s: float = 0.0) -> App:
    app = App("demo")

    @app.handler("orders", retry_attempts=3, retry_delay_s=0.001)
    async def on_order(order: Order, ctx: MessageContext) -> None:
        if order.poison:
            raise ValueError(f"order {order.seq} is poison")
        if work_s:
            await asyncio.sleep(work_s)
        key = ctx.message.stream.key
        if order.seq <= ledger.last_seq.get(key, -1):
            ledger.out_of_order += 1
        ledger.last_seq[key] = order.seq
        ledger.handled[order.seq] += 1
        ledger.total_cents += order.amount_cents

    return app


@dataclass(frozen=True)
class DemoResult:
    published: int
    handled: int
    dead_lettered: int
    duplicates: int
    lost: int
    out_of_order: int
    elapsed_s: float

    def summary(self) -> str:
        return (
            f"published={self.published} handled={self.handled} "
            f"dead_lettered={self.dead_lettered} duplicates={self.duplicates} "
            f"lost={self.lost} elapsed_s={self.elapsed_s:.2f}"
        )


Id = TypeVar("Id", bound=Hashable)


def summarize(
    published: Iterable[Id],
    handled: Mapping[Id, int],
    dead_lettered: Iterable[Id],
    *,
    out_of_order: int = 0,
    elapsed_s: float = 0.0,
) -> DemoResult:
    """Count the summary from what happened to each message id.

    ``handled`` maps an id to how many times the handler finished it; ``dead_lettered``
    holds one id per dead letter. A message delivered more than once in total counts
    once as handled (or dead-lettered) and adds a duplicate per extra delivery.
    """
    published_ids = set(published)
    deliveries: Counter[Id] = Counter({i: n for i, n in handled.items() if n > 0})
    handled_ids = set(deliveries)
    dead_ids: set[Id] = set()
    for i in dead_lettered:
        dead_ids.add(i)
        deliveries[i] += 1
    return DemoResult(
        published=len(published_ids),
        handled=len(handled_ids),
        dead_lettered=len(dead_ids),
        duplicates=sum(n - 1 for n in deliveries.values()),
        lost=len(published_ids - handled_ids - dead_ids),
        out_of_order=out_of_order,
        elapsed_s=elapsed_s,
    )


def not_embedded(config: Config) -> str | None:
    """Why ``config`` cannot run the demo (which is all in one process), or None."""
    if config.queues.adapter != "memory":
        return (
            f'the demo runs on the embedded adapter: queues.adapter must be "memory", '
            f"got {config.queues.adapter!r} (use configs/local.toml, or no --config)"
        )
    if config.balancer.kind == "dynamic" and config.balancer.membership != "memory":
        return (
            f'the demo runs in one process: balancer.membership must be "memory", '
            f"got {config.balancer.membership!r} (use configs/local.toml, or no --config)"
        )
    return None


async def run_demo(
    messages: int,
    streams: int,
    *,
    poison: int = 0,
    work_s: float = 0.0,
    config: Config | None = None,
    on_progress: object = None,
    timeout_s: float = 120.0,
) -> DemoResult:
    """Start a daemon, publish ``messages`` over ``streams`` while it runs, wait, count."""
    config = config or Config()
    reset_broker("demo")
    adapter = MemoryAdapter("demo")
    ledger = Ledger()
    daemon = WorkerDaemon(build_app(ledger, work_s), config, adapter=adapter)
    client = Client(adapter, daemon.mapper)
    poisoned = set(range(0, messages, max(1, messages // poison))[:poison]) if poison else set()
    started = time.perf_counter()
    await daemon.start()
    published: list[int] = []
    batch = 1000
    for start in range(0, messages, batch):
        seqs = range(start, min(start + batch, messages))
        tokens = await client.publish_batch(
            Publish("orders", f"customer-{i % streams}", Order(i, 100 + i % 900, i in poisoned))
            for i in seqs
        )
        published.extend(seqs[: len(tokens)])
        await asyncio.sleep(0)  # let the daemon work while we publish
    deadline = time.monotonic() + timeout_s
    while len(ledger.handled) + daemon.stats.dead_lettered < messages:
        if callable(on_progress):
            on_progress(len(ledger.handled) + daemon.stats.dead_lettered)
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    if callable(on_progress):
        on_progress(len(ledger.handled) + daemon.stats.dead_lettered)
    await daemon.stop()
    elapsed = time.perf_counter() - started
    letters = await adapter.dead_letters.read("demo", limit=2 * messages)
    return summarize(
        published,
        ledger.handled,
        [_order.decode(letter.message.body).seq for letter in letters],
        out_of_order=ledger.out_of_order,
        elapsed_s=elapsed,
    )


_order = msgspec.json.Decoder(Order)
