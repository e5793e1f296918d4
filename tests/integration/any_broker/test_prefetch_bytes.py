"""A daemon's memory is bounded in bytes, whatever the body size: ``[worker]
prefetch_bytes`` beside ``cache_capacity``, on each broker.

600 messages of 1 MiB waiting, one real worker process over 8 queues, handlers slow
enough that the backlog waits in the daemon. The peak is the kernel's high-water mark
(``VmHWM``), not a sample that could miss it. Measured:

* Redis (200 ms handlers): before the byte bound it peaked at 644 MB of RSS (478 MB
  once idle), the count bound letting every queue pull hundreds of them; with the
  default (64 MiB) at 133 MB.
* Kafka (``static`` balancer, a partition consumer per queue, 1 s handlers): without
  the byte bound it peaked at 745 MB (2 s handlers); with the default at ~205 MB, of
  which ~150 MB is the floor of eight consumers and their fetch buffers (docs/limits.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conveyor.client import Client, Publish
from conveyor.platform.config import load_config
from tests.conftest import wait_until
from tests.integration.any_broker.conftest import Broker
from tests.integration.redis.conftest import Worker, read_records
from tests.rss import peak_rss_mb

pytestmark = pytest.mark.slow

BACKLOG = 600
BODY = 1 << 20


@dataclass(frozen=True)
class Bound:
    work_ms: int
    peak_max_mb: int
    within_s: float
    sections: dict[str, dict[str, object]] = field(default_factory=dict)


BOUNDS = {
    "redis": Bound(work_ms=200, peak_max_mb=250, within_s=90),
    "kafka": Bound(work_ms=1000, peak_max_mb=300, within_s=120,
                   sections={"kafka": {"max_request_size": 2 * BODY}}),
}


async def test_a_backlog_of_large_bodies_stays_under_the_byte_bound(
    broker: Broker, tmp_path: Path
) -> None:
    bound = BOUNDS[broker.name]
    config_path = broker.config_file(tmp_path / "c.toml", queues={"total": 8},
                                     **bound.sections)
    async with Client.from_config(load_config(config_path, environ={})) as client:
        for start in range(0, BACKLOG, 20):
            await client.publish_batch([Publish("items", f"s{i}", {"seq": i, "pad": "x" * BODY})
                                        for i in range(start, start + 20)])
    worker = Worker("w", config_path, tmp_path, work_ms=bound.work_ms)
    try:
        def handled() -> int:
            assert worker.alive(), worker.stderr[-2000:]
            return len(read_records([worker.record]))

        await wait_until(lambda: handled() >= BACKLOG, bound.within_s, 0.2,
                         "the backlog handled")
        peak = peak_rss_mb(worker.proc.pid)
        assert worker.stop() == 0
    finally:
        worker.kill()
    rows = read_records([worker.record])
    # No fault, one worker, a graceful stop: each once, none lost, no duplicate allowed.
    assert sorted(seq for *_, seq, _ in rows) == list(range(BACKLOG))
    assert peak < bound.peak_max_mb, f"peak RSS {peak:.0f} MB"
