"""The broker stops answering for longer than the group session (tansu SIGSTOPped: its
memory storage would lose everything to a restart), with two ``conveyor worker``
daemons on the shipped configs/kafka.toml."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from conveyor.backends import create_adapter
from conveyor.client import Publish, SyncClient
from conveyor.platform.config import Config, load_config
from tests.conftest import process_stopped, wait_until_sync
from tests.integration.redis.conftest import REPO, Worker, read_records
from tests.integration.redis.conftest import workers as workers  # the fixture
from tests.servers.tansu import start_tansu

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SHIPPED = REPO / "configs" / "kafka.toml"
CACHE = 64
PAUSE_S = 10.0
"""Past the shipped 6 s session. tansu expires the members' sessions in about half the
runs: on SIGCONT it may read the heartbeats that waited in its sockets before its
session timer fires. The test holds either way."""


def group_lag(config: Config) -> int:
    async def read() -> int:
        adapter = create_adapter("kafka", config)
        try:
            return sum([await adapter.lag(q, "rec") for q in range(config.queues.total)])
        finally:
            await adapter.close()
    return asyncio.run(read())


def test_a_broker_paused_past_the_session_loses_nothing(
    tmp_path: Path, workers: list[Worker]
) -> None:
    broker = start_tansu(tmp_path)
    env = {"CONVEYOR_KAFKA__BOOTSTRAP": broker.bootstrap,
           "CONVEYOR_KAFKA__TOPIC": f"pause-{uuid.uuid4().hex[:8]}",
           "CONVEYOR_WORKER__CACHE_CAPACITY": str(CACHE)}
    config = load_config(SHIPPED, environ=env)
    n = 3000
    try:
        ws = [Worker(f"w{i}", SHIPPED, tmp_path, work_ms=10, env=env) for i in range(2)]
        workers.extend(ws)
        wait_until_sync(lambda: all("ready" in w.stderr for w in ws), 60, "both assigned")
        with SyncClient.from_config(config) as client:
            client.publish_batch(Publish("items", f"k{i % 20}", {"seq": i}) for i in range(n))
        records = [w.record for w in ws]
        wait_until_sync(lambda: len(read_records(records)) >= 300, 30, "work under way")
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            pid = broker.proc.pid
            wait_until_sync(lambda: process_stopped(pid), 10, "tansu to stop")
            time.sleep(PAUSE_S)  # the outage under test
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 60,
                        "every message handled")
        # What was handled but not committed when the sessions lapsed runs again once
        # the members are back: wait until the group has committed everything.
        wait_until_sync(lambda: group_lag(config) == 0, 60, "every offset committed")
        assert [w.stop() for w in ws] == [0, 0]
    finally:
        broker.stop()
    lapsed = sum("session lapsed" in w.stderr for w in ws)
    ids = Counter(r[5] for r in read_records(records))
    assert len(ids) == n, "a message was lost"
    duplicates = sum(ids.values()) - n
    print(f"\nbroker paused {PAUSE_S:.0f}s: {lapsed} session(s) lapsed, "
          f"{duplicates} duplicates")
    # At least once: only what the agents of a lapsed member held (pulled, not
    # committed; handled meanwhile from their caches) comes again, at most a cache on
    # each of its 4 partitions. A member whose session held loses no commit.
    assert duplicates <= lapsed * 4 * CACHE
