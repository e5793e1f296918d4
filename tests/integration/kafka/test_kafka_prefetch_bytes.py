"""A Kafka daemon's memory is bounded in bytes too (``[worker] prefetch_bytes``).

600 messages of 1 MiB waiting, one real worker process with a partition consumer per
queue (``static`` balancer) and handlers of 1 s, so the backlog waits in the daemon:
without the byte bound it peaked at 745 MB of RSS (2 s handlers); with the default
(64 MiB) at ~205 MB, of which ~150 MB is the floor of eight consumers and their fetch
buffers (docs/limits.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.client import Client, Publish
from conveyor.platform.config import load_config
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.redis.conftest import Worker, read_records
from tests.rss import peak_rss_mb

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BACKLOG = 600
BODY = 1 << 20
PEAK_MAX_MB = 300


async def test_a_backlog_of_large_bodies_stays_under_the_byte_bound(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    config_path = tmp_path / "kafka.toml"
    config_path.write_text(
        'queues = { adapter = "kafka", total = 8 }\n'
        f'kafka = {{ bootstrap = "{tansu.bootstrap}", topic = "{topic}", '
        f'max_request_size = {2 * BODY} }}\n'
        'balancer = { kind = "static" }\n')
    async with Client.from_config(load_config(config_path, environ={})) as client:
        for start in range(0, BACKLOG, 20):
            await client.publish_batch([Publish("items", f"s{i}", {"seq": i, "pad": "x" * BODY})
                                        for i in range(start, start + 20)])
    worker = Worker("w", config_path, tmp_path, work_ms=1000)
    try:
        def handled() -> int:
            assert worker.alive(), worker.stderr[-2000:]
            return len(read_records([worker.record]))

        await wait_until(lambda: handled() >= BACKLOG, 120, 0.2, "the backlog handled")
        peak = peak_rss_mb(worker.proc.pid)
        assert worker.stop() == 0
    finally:
        worker.kill()
    rows = read_records([worker.record])
    assert sorted(seq for *_, seq, _ in rows) == list(range(BACKLOG))  # each once, none lost
    assert peak < PEAK_MAX_MB, f"peak RSS {peak:.0f} MB"
