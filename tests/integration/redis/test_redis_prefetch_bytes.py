"""A daemon's memory is bounded in bytes, whatever the body size: ``[worker]
prefetch_bytes`` beside ``cache_capacity``.

600 messages of 1 MiB waiting on a shipped-like Redis config, one real worker process:
before the byte bound it peaked at 644 MB of RSS (478 MB once idle), the count bound
letting every queue pull hundreds of them. The peak is the kernel's high-water mark
(``VmHWM``), not a sample that could miss it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.client import Client, Publish
from conveyor.platform.config import load_config
from tests.conftest import wait_until
from tests.integration.redis.conftest import RedisServer, Worker, read_records, write_config
from tests.rss import peak_rss_mb

pytestmark = [pytest.mark.redis, pytest.mark.slow]

BACKLOG = 600
BODY = 1 << 20
PEAK_MAX_MB = 250
"""Measured with the default prefetch_bytes (64 MiB): 133 MB."""


async def test_a_backlog_of_large_bodies_stays_under_the_byte_bound(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker]
) -> None:
    config_path = write_config(tmp_path / "redis.toml", redis_server.url)
    async with Client.from_config(load_config(config_path, environ={})) as client:
        for start in range(0, BACKLOG, 20):
            await client.publish_batch([Publish("items", f"s{i}", {"seq": i, "pad": "x" * BODY})
                                        for i in range(start, start + 20)])
    worker = Worker("w", config_path, tmp_path, work_ms=200)
    workers.append(worker)

    def handled() -> int:
        assert worker.alive(), worker.stderr[-2000:]
        return len(read_records([worker.record]))

    await wait_until(lambda: handled() >= BACKLOG, 90, 0.2, "the backlog handled")
    peak = peak_rss_mb(worker.proc.pid)
    assert worker.stop() == 0
    rows = read_records([worker.record])
    assert sorted(seq for *_, seq, _ in rows) == list(range(BACKLOG))  # each once, none lost
    assert peak < PEAK_MAX_MB, f"peak RSS {peak:.0f} MB"
