"""No handler starts on a queue this daemon does not own (in-process, memory broker)."""

from __future__ import annotations

import time

from conveyor import Client
from conveyor.platform.balancer import StaticBalancer
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Record,
    config,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)


class Lapsing(StaticBalancer):
    """Owns every queue on a short lease that it renews until told to stop: then the
    last deadline it gave passes, like a lease whose renewal is overdue."""

    def __init__(self) -> None:
        super().__init__(range(8))
        self.renewing = True
        self.deadline = 0.0
        self.asked_while_lapsed = 0

    def owned_until(self, queue: int) -> float:
        if self.renewing:
            self.deadline = time.monotonic() + 0.05
        else:
            self.asked_while_lapsed += 1
        return self.deadline


async def test_runners_start_nothing_while_ownership_lapsed_and_resume_when_it_returns() -> None:
    adapter = fresh_adapter()
    record = Record()
    balancer = Lapsing()
    d = daemon(recording_app(record, delay_s=0.01), adapter, config(slots={"count": 2}),
               balancer=balancer)
    ids = await publish_items(Client(adapter, d.mapper), 400, streams=40)
    await d.start()
    try:
        await wait_until(lambda: record.handled >= 20, 10, what="handlers at work")
        balancer.renewing = False  # overdue: nothing may start once the deadline passed
        await wait_until(lambda: record.active == 0, 5, what="the calls under way to finish")
        handled_at_lapse = record.handled
        held = sum(len(a.cache) for a in d.agents.values())
        assert held > 0, "nothing was waiting in the caches: nothing to test"
        # Every agent that tried to start something keeps asking (a poll per
        # poll_timeout_s / 5); many answers later, still nothing has started.
        await wait_until(lambda: balancer.asked_while_lapsed >= 40, 10,
                         what="the agents to re-check ownership a while")
        assert record.handled == handled_at_lapse and record.active == 0
        balancer.renewing = True  # renewed: the runners are woken, the caches run
        await wait_until(lambda: record.handled == 400, 20, what="every message handled")
    finally:
        report = await d.stop()
    assert set(record.calls) == set(ids) and record.duplicates == 0
    assert (report.abandoned, report.lost) == (0, 0)


async def test_a_lost_queue_runs_nothing_more_and_what_it_held_is_counted_as_lost() -> None:
    adapter = fresh_adapter()
    record = Record()
    balancer = Lapsing()
    d = daemon(recording_app(record, delay_s=0.01), adapter, config(slots={"count": 2}),
               balancer=balancer)
    ids = await publish_items(Client(adapter, d.mapper), 400, streams=40)
    await d.start()
    try:
        await wait_until(lambda: record.handled >= 20, 10, what="handlers at work")
        balancer.renewing = False
        await wait_until(lambda: record.active == 0, 5, what="the calls under way to finish")
        handled_before = set(record.calls)
        held = sum(a.unacknowledged for a in d.agents.values())
        assert held > 0, "nothing was held: nothing to test"
        for queue in list(d.agents):  # what a balancer does once the lease is gone
            await d.queues.queue_lost(queue)
        assert set(record.calls) == handled_before
    finally:
        report = await d.stop()
    assert (report.lost, report.abandoned, report.released) == (held, 0, 0)

    # The next owner gets everything back: nothing is lost, and only messages the first
    # daemon had already run (their acks held back by the lapse) can run twice.
    after = daemon(recording_app(record), adapter, config())
    await after.start()
    try:
        await wait_until(lambda: set(record.calls) == set(ids), 20, what="all handled")
    finally:
        await after.stop()
    doubled = {mid for mid, n in record.calls.items() if n > 1}
    assert doubled <= handled_before and len(doubled) <= held
