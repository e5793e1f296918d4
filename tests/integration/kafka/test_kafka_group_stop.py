"""kafka-group: a stop that comes while the group is assigning partitions to the member
(the stop signal of a daemon that just rejoined) waits for the assignment, then drains
what it acquired — calls for one queue never overlap (``BalanceListener``).

Found by the paused-member test (test_kafka_fencing.py): a victim told to stop as it
rejoined had its new partitions released before their agents existed, so they were
drained only after it had left the group, beside their next owner.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.adapters.kafka.adapter import KafkaAdapter
from conveyor.adapters.kafka.group_balancer import KafkaGroupBalancer
from conveyor.platform.balancing.membership import MemberInfo
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import HeldAcquisitions, kafka_config

pytestmark = pytest.mark.kafka

QUEUES = 2


async def test_a_stop_during_an_assignment_drains_what_it_acquired_after_acquiring_it(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES},
                          balancer={"kind": "kafka-group"})
    adapter = KafkaAdapter(config.kafka, QUEUES)
    balancer = KafkaGroupBalancer(adapter, f"g-{topic}", QUEUES)
    listener = HeldAcquisitions()
    try:
        await balancer.start(MemberInfo("m", "h", 1, 0.0), listener)
        async with asyncio.timeout(30):
            await listener.acquiring.wait()
        stopping = asyncio.create_task(balancer.stop())
        # The stop has cancelled its report loop: it is at its release now.
        await wait_until(lambda: balancer._reporting is None, 10, 0.01, "the stop's release")
        listener.go.set()
        async with asyncio.timeout(30):
            await stopping
    finally:
        await adapter.close()
    for queue in range(QUEUES):
        mine = [call for call, q in listener.calls if q == queue]
        assert mine == ["acquiring", "acquired", "released"], listener.calls
