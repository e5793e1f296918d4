"""Fencing: a daemon starts no handler on a queue it does not own, and a queue it lost
is handed on whole; the same on every adapter.

A daemon (the real one, in process) runs on the adapter under a balancer whose lease
lapses when the test says so. What the adapter contributes: a receiver shut down with
messages delivered and not acknowledged hands them to the next receiver of its queue
(nothing lost), and acknowledgements the lapse held back leave at most those messages
to run twice. How each backend refuses a stale owner's acknowledgements by itself is
its own test (Redis: tests/integration/redis/test_redis_adapter.py, fenced acks; Kafka:
tests/integration/kafka/test_kafka_fencing.py, a paused group member).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

from conveyor import Client, WorkerDaemon, load_config
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.balancing.balancer import StaticBalancer
from conveyor.platform.config import Config
from conveyor.platform.message import Message
from tests.conftest import wait_until
from tests.contract.conftest import QUEUES
from tests.integration.memory_harness import Item, Record, recording_app

MESSAGES, STREAMS = 200, 40


class Lapsing(StaticBalancer):
    """Owns every queue on a short lease that it renews until told to stop: then the
    last deadline it gave passes, like a lease whose renewal is overdue."""

    def __init__(self) -> None:
        super().__init__(range(QUEUES))
        self.renewing = True
        self.deadline = 0.0
        self.asked_while_lapsed = 0

    def owned_until(self, queue: int) -> float:
        if self.renewing:
            self.deadline = time.monotonic() + 0.05
        else:
            self.asked_while_lapsed += 1
        return self.deadline


async def lapse(balancer: Lapsing, record: Record) -> None:
    """Stop renewing, and return once the last deadline given has passed (nothing may
    start from then on) and the calls started before it have finished."""
    balancer.renewing = False
    await wait_until(lambda: time.monotonic() > balancer.deadline, 5,
                     what="the last deadline to pass")
    await wait_until(lambda: record.active == 0, 5, what="the calls under way to finish")


def daemon_config() -> Config:
    """Four slots, and a pull every 100 ms (an ownership re-check every 20 ms)."""
    return load_config(environ={}, overrides={"queues": {"total": QUEUES},
                                              "slots": {"count": 4},
                                              "worker": {"poll_timeout_ms": 100}})


async def publish(client: Client) -> list[str]:
    """Items 0..MESSAGES-1 round-robin over STREAMS streams, one enqueue per queue;
    returns their message ids."""
    by_queue: dict[int, list[Message]] = defaultdict(list)
    ids = []
    for i in range(MESSAGES):
        message = client.build("items", f"s{i % STREAMS}", Item(i))
        by_queue[client.mapper.queue_for(message.stream)].append(message)
        ids.append(message.id)
    for queue, messages in by_queue.items():
        await client.adapter.enqueue(queue, messages)
    return ids


async def test_runners_start_nothing_while_ownership_lapsed_and_resume_when_it_returns(
    adapter: QueueAdapter,
) -> None:
    record = Record()
    balancer = Lapsing()
    app = recording_app(record, delay_s=0.005, name=f"fenced-{uuid.uuid4().hex[:6]}")
    d = WorkerDaemon(app, daemon_config(), adapter=adapter, balancer=balancer)
    ids = await publish(Client(adapter, d.mapper))
    await d.start()
    try:
        await wait_until(lambda: record.handled >= 20, 15, what="handlers at work")
        await lapse(balancer, record)
        handled_at_lapse = record.handled
        held = sum(len(a.cache) for a in d.agents.values())
        assert held > 0, "nothing was waiting in the caches: nothing to test"
        # Every agent that tried to start something keeps asking (a poll per
        # poll_timeout_s / 5); many answers later, still nothing has started.
        await wait_until(lambda: balancer.asked_while_lapsed >= 40, 10,
                         what="the agents to re-check ownership a while")
        assert record.handled == handled_at_lapse and record.active == 0
        balancer.renewing = True  # renewed: the runners are woken, the caches run
        await wait_until(lambda: record.handled == MESSAGES, 30, what="every message handled")
    finally:
        report = await d.stop()
    assert set(record.calls) == set(ids) and record.duplicates == 0
    assert (report.abandoned, report.moved) == (0, 0)


async def test_a_lost_queue_runs_nothing_more_and_the_next_owner_gets_all_it_held(
    adapter: QueueAdapter,
) -> None:
    record = Record()
    balancer = Lapsing()
    name = f"fenced-{uuid.uuid4().hex[:6]}"
    d = WorkerDaemon(recording_app(record, delay_s=0.005, name=name), daemon_config(),
                     adapter=adapter, balancer=balancer)
    ids = await publish(Client(adapter, d.mapper))
    await d.start()
    try:
        await wait_until(lambda: record.handled >= 20, 15, what="handlers at work")
        await lapse(balancer, record)
        handled_before = set(record.calls)
        agents = list(d.agents.values())
        held = sum(a.unacknowledged for a in agents)
        acked = sum(a.acked for a in agents)
        assert held > 0, "nothing was held: nothing to test"
        for queue in list(d.agents):  # what a balancer does once the lease is gone
            await d.queues.queue_lost(queue)
        assert set(record.calls) == handled_before
        # An acknowledgement sent before the lapse may be confirmed since (a slow
        # broker's answer): that message is done, not moved.
        confirmed_since = sum(a.acked for a in agents) - acked
    finally:
        report = await d.stop()
    assert (report.moved, report.abandoned, report.released) == (held - confirmed_since, 0, 0)

    # The next owner gets everything back: nothing is lost, and only messages the first
    # daemon had already run (their acks held back by the lapse) can run twice.
    after = WorkerDaemon(recording_app(record, name=name), daemon_config(), adapter=adapter,
                         balancer=StaticBalancer(range(QUEUES)))
    await after.start()
    try:
        await wait_until(lambda: set(record.calls) == set(ids), 30, what="all handled")
    finally:
        await after.stop()
    doubled = {mid for mid, n in record.calls.items() if n > 1}
    assert doubled <= handled_before and len(doubled) <= held
