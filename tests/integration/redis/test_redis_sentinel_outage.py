"""Every sentinel down while the primary they named stays up, under a worker and a client.

The sentinels only say where the primary is; with all of them down (restarted together,
or cut off) nothing can fail over, and the primary they last named is still the one.
Connections already open go on working, but any new one used to need a sentinel's
answer first: once the primary dropped its clients' connections (a restart of a proxy,
its ``timeout``, ``CLIENT KILL``), publishes and workers waited for the sentinels and
failed after ``retry_max_s`` although the primary answered.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor import Publish, SyncClient
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import Worker, read_records, write_config
from tests.servers import SENTINEL_SERVICE, RedisSentinelServers

pytestmark = [pytest.mark.redis, pytest.mark.redis_sentinel, pytest.mark.slow]

RETRY_MAX_S = 3.0
"""``[redis] retry_max_s``: how long a call waits out an outage before it raises."""


def test_new_connections_reach_the_last_named_primary_while_no_sentinel_answers(
    fresh_redis_sentinel: RedisSentinelServers, workers: list[Worker], tmp_path: Path
) -> None:
    servers = fresh_redis_sentinel
    cfg = write_config(tmp_path / "s.toml", "redis:///0", redis={
        "mode": "sentinel", "sentinels": servers.addresses,
        "sentinel_service": SENTINEL_SERVICE, "min_replicas": 1,
        # A replica's acknowledgement takes milliseconds, but on a busy machine once took
        # more than 500 (the first publish was PublishUncertain): 2 s, as test_redis_replicas.
        "replica_timeout_ms": 2000, "retry_max_s": RETRY_MAX_S,
    })
    worker = Worker("w0", cfg, tmp_path)
    workers.append(worker)
    primary = servers.node(servers.primary()[1])

    def handled() -> set[int]:
        return {row[4] for row in read_records([worker.record])}

    with SyncClient.from_config(load_config(cfg, environ={})) as client:
        client.publish_batch(Publish("items", f"s{i}", {"seq": i}) for i in range(20))
        wait_until_sync(lambda: handled() >= set(range(20)), 30,
                        "the worker to handle what was published with the sentinels up")
        for sentinel in servers.sentinels:
            sentinel.kill()
        # The primary drops every client's connection (its own admin one aside).
        assert primary.admin().client_kill_filter(_type="normal") >= 2
        began = time.monotonic()
        client.publish_batch(Publish("items", f"s{i}", {"seq": i}) for i in range(20, 40))
        took_s = time.monotonic() - began
        wait_until_sync(lambda: handled() >= set(range(40)), 2 * RETRY_MAX_S,
                        "the worker to handle what was published with the sentinels down")
    assert took_s < RETRY_MAX_S / 2, f"the publish waited {took_s:.1f}s for the sentinels"
    assert worker.alive(), worker.stderr
    assert "connecting to the primary they last named" in worker.stderr
    assert "named no primary" not in worker.stderr, worker.stderr
    assert worker.stop() == 0
    seqs = [row[4] for row in read_records([worker.record])]
    assert set(seqs) == set(range(40)), "a message was lost"
    # Redelivered at most: the first batch, whose acknowledgements may have been on the
    # connections the primary dropped.
    assert len(seqs) - 40 <= 20
