"""A Redis Cluster with a primary down and no replica to take its slots, set to serve the
others' meanwhile (``cluster-require-full-coverage no``): a producer publishes to the
queues whose primaries answer. Before its first publish a client reads every primary's
eviction policy (docs/redis.md, "Eviction policy"); one primary not answering made every
publish wait ``retry_max_s`` and fail, to any queue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor import SyncClient
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.config import load_config
from conveyor.platform.mapper import HashRingQueueMapper
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import write_config
from tests.servers import RedisClusterServers

pytestmark = [pytest.mark.redis, pytest.mark.redis_cluster, pytest.mark.slow]

TOTAL = 8
KEYS = Keys("t", cluster=True)
RETRY_MAX_S = 3.0


def test_a_publish_to_a_primary_that_answers_goes_on_while_another_is_down(
    fresh_redis_cluster: RedisClusterServers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = fresh_redis_cluster
    for node in cluster.nodes:
        node.admin().config_set("cluster-require-full-coverage", "no")
    down = cluster.primaries()[1]
    cluster.node(cluster.replica_of(down)[1]).kill()  # no replica to take over
    cluster.node(down[1]).kill()
    live = next(n for n in cluster.live_nodes() if n.address != down)
    wait_until_sync(lambda: live.admin().cluster("INFO")["cluster_state"] == "ok", 10,
                    "the cluster to serve the slots of the primaries that answer")
    mapper = HashRingQueueMapper(TOTAL)
    stream = next(k for k in (f"s{i}" for i in range(1000))
                  if cluster.primary_for_key(KEYS.queue(mapper.queue_for_key("items", k)))
                  != down)
    cfg = write_config(tmp_path / "c.toml", live.url, queues={"total": TOTAL}, redis={
        "mode": "cluster", "retry_max_s": RETRY_MAX_S})

    def policy_reads() -> int:  # CONFIG GET calls the live primary has answered
        return int(live.admin().info("commandstats").get("cmdstat_config|get", {})
                   .get("calls", 0))

    with SyncClient.from_config(load_config(cfg, environ={})) as client:
        began = time.monotonic()
        token = client.publish("items", stream, {"seq": 1})
        took_s = time.monotonic() - began
        reads = policy_reads()
        for seq in range(2, 22):  # the policy read again, not logged; not every publish:
            client.publish("items", stream, {"seq": seq})  # EvictionGuard.UNREAD_AGAIN_S
        reads = policy_reads() - reads
    assert took_s < RETRY_MAX_S / 2, f"the publish waited {took_s:.1f}s for the down primary"
    assert reads <= 2, f"{reads} reads of the policy for 20 publishes"
    with cluster.client() as check:
        assert check.xlen(KEYS.queue(token.queue)) == 21
    said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(said) == 1 and f"127.0.0.1:{down[1]}" in said[0], said
