"""A message whose handling kills its worker (``os._exit(1)``) under ``conveyor worker
--processes 2:2`` on the shipped config, on each broker: after ``max_deliveries`` runs
(3; and the default 5, under which a redelivered message's first counted start runs
beside the others, see ``PullingAgent._count_start``) it is a ``DeliveryLimit`` dead
letter and every other message is handled.

On Redis the next owner counts the starts in the queue's delivery records; on Kafka
the delivery record (kafka/handoff.py) makes it take the dead process's unfinished
offsets for redelivered ones. Duplicates allowed: the messages a dying process had
finished but not yet acknowledged (each crash's batch on the poisoned queue), never
more than 3 runs of any message (tests/integration/poison.py checks it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.any_broker.conftest import Broker
from tests.integration.poison import run_poison_under_supervisor

pytestmark = pytest.mark.slow

SHORTER = {"redis": {"CONVEYOR_BALANCER__LEASE_TTL_S": "2"}}
"""On Redis each crash leaves the poisoned queue to its next owner once the dead
process's lease lapses: the shipped 5 s made three crashes wait 15 s. The count of
starts and the letter do not depend on the lease's length, so the lease is 2 s here."""


@pytest.mark.parametrize("max_deliveries", [3, 5])
def test_a_message_that_kills_its_worker_becomes_a_dead_letter_after_max_deliveries(
    broker: Broker, tmp_path: Path, max_deliveries: int
) -> None:
    env = {**broker.env, **SHORTER.get(broker.name, {})}
    print("\n" + run_poison_under_supervisor(broker.shipped, env, tmp_path, max_deliveries))
