"""A Redis that may evict keys is refused: a full server under any ``maxmemory-policy``
but ``noeviction`` deletes queue streams (confirmed messages lost) and, under the
``volatile-*`` policies too, keys with a TTL — leases (messages run twice) and publish
markers (retries written twice). Workers exit 2 at start, a client's first publish
raises ``ConfigError``, ``conveyor status`` shows the policy and warns; ``[redis]
allow_eviction = true`` accepts the risk with a warning. Cluster: every primary is read;
Sentinel: the primary it names. Where ``CONFIG`` is forbidden, ``INFO memory`` tells.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import App, Client, ConfigError, load_config
from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import RedisConfig
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until, wait_until_sync
from tests.integration.redis.conftest import (
    REPO,
    Worker,
    read_records,
    rechecking_daemon,
    status_json,
    write_config,
)
from tests.servers import (
    SENTINEL_SERVICE,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
)

pytestmark = pytest.mark.redis


def test_a_worker_refuses_a_server_that_may_evict_with_exit_2(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    worker = Worker("w", write_config(tmp_path / "c.toml", redis_server.url), tmp_path)
    workers.append(worker)
    assert worker.proc.wait(30) == 2, worker.stderr
    err = worker.stderr
    assert "conveyor: error: config: $.redis.allow_eviction" in err, err
    assert "'allkeys-lru'" in err and "allow_eviction = true" in err, err
    assert "Traceback" not in err, err
    assert not redis_server.client().keys("t:app:*"), "a refused worker took leases"


def test_a_supervised_worker_refuses_it_with_exit_2_too(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Under ``--processes`` the children read the policy; the one that refuses exits
    with the config status and the supervisor passes it on: exit 2, not 1."""
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    config = write_config(tmp_path / "c.toml", redis_server.url)
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
         "--config", str(config), "--processes", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "CONVEYOR_TEST_RECORD": str(tmp_path / "w.rec")},
    )
    assert done.returncode == 2, done.stderr
    assert "it refused the configuration" in done.stderr, done.stderr
    assert "$.redis.allow_eviction" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not redis_server.client().keys("t:app:*"), "a refused worker took leases"


def test_with_allow_eviction_the_worker_runs_and_warns(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    redis_server.client().config_set("maxmemory-policy", "volatile-lru")
    path = write_config(tmp_path / "c.toml", redis_server.url,
                        redis={"allow_eviction": True})
    worker = Worker("w", path, tmp_path)
    workers.append(worker)

    async def publish() -> None:
        async with Client.from_config(load_config(path)) as client:
            for seq in range(20):
                await client.publish("items", f"k{seq % 4}", {"seq": seq})

    import asyncio

    asyncio.run(publish())
    wait_until_sync(lambda: len(read_records([worker.record])) >= 20, 30, "20 handled")
    assert worker.stop() == 0, worker.stderr
    assert sorted(r[4] for r in read_records([worker.record])) == list(range(20))
    assert "'volatile-lru'" in worker.stderr
    assert "accepted by [redis] allow_eviction = true" in worker.stderr


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
async def test_a_clients_first_publish_is_refused_until_the_policy_is_noeviction(
    redis_server: RedisServer, tmp_path: Path, policy: str,
) -> None:
    admin = redis_server.client()
    admin.config_set("maxmemory-policy", policy)
    config = load_config(write_config(tmp_path / "c.toml", redis_server.url))
    async with Client.from_config(config) as client:
        with pytest.raises(ConfigError, match=rf"allow_eviction.*'{policy}'"):
            await client.publish("items", "k", {"seq": 1})
        assert admin.xlen("t:q:0") + sum(admin.xlen(f"t:q:{q}") for q in range(1, 8)) == 0
        admin.config_set("maxmemory-policy", "noeviction")
        await client.publish("items", "k", {"seq": 2})  # asked again: accepted now
    assert sum(admin.xlen(f"t:q:{q}") for q in range(8)) == 1


async def test_where_config_is_forbidden_info_memory_tells(
    redis_server: RedisServer,
) -> None:
    """A user without the CONFIG command (as on managed services): INFO memory is read."""
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all",
                          "-config")
    admin.config_set("maxmemory-policy", "allkeys-lfu")
    url = f"redis://app:secret@127.0.0.1:{redis_server.port}/0"
    adapter = RedisAdapter(RedisConfig(url=url, prefix="t"))
    try:
        with pytest.raises(Exception, match="no permissions"):
            await adapter.redis.config_get("maxmemory-policy")  # the premise
        with pytest.raises(ConfigError, match="'allkeys-lfu'"):
            await adapter.check_server()
        assert await adapter.eviction_policy() == "allkeys-lfu"
    finally:
        await adapter.close()


def test_status_shows_the_policy_and_warns_of_an_evicting_one(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    path = write_config(tmp_path / "c.toml", redis_server.url)
    report, err = status_json(path)
    assert report["eviction_policy"] == "noeviction"
    assert "maxmemory-policy" not in err, err
    redis_server.client().config_set("maxmemory-policy", "allkeys-lru")
    report, err = status_json(path)
    assert report["eviction_policy"] == "allkeys-lru"
    assert "maxmemory-policy is allkeys-lru" in err
    assert "workers refuse it unless [redis] allow_eviction = true" in err, err
    every, err = status_json(path, app=None)  # every app's view says it too
    assert every["eviction_policy"] == "allkeys-lru" and every["apps"] == []
    assert "maxmemory-policy is allkeys-lru" in err, err


async def test_a_cluster_is_refused_when_any_primary_may_evict(
    redis_cluster: RedisClusterServers,
) -> None:
    primaries = redis_cluster.primaries()
    with redis_cluster.node(primaries[1][1]).admin() as one:
        one.config_set("maxmemory-policy", "allkeys-lru")
    adapter = RedisAdapter(RedisConfig(url=redis_cluster.url, mode="cluster",
                                       prefix="evict"))
    try:
        with pytest.raises(ConfigError, match=rf"'allkeys-lru' on [^,]*:{primaries[1][1]}"):
            await adapter.check_server()
        summary = await adapter.eviction_policy()
        assert summary is not None and f":{primaries[1][1]}=allkeys-lru" in summary
        assert summary.count("=noeviction") == len(primaries) - 1, summary
    finally:
        await adapter.close()
        with redis_cluster.node(primaries[1][1]).admin() as one:
            one.config_set("maxmemory-policy", "noeviction")


async def test_a_sentinel_managed_primary_is_refused_when_it_may_evict(
    redis_sentinel: RedisSentinelServers,
) -> None:
    _, port = redis_sentinel.primary()
    with redis_sentinel.node(port).admin() as primary:
        primary.config_set("maxmemory-policy", "volatile-lfu")
    cfg = RedisConfig(url="redis:///0", mode="sentinel", sentinels=redis_sentinel.addresses,
                      sentinel_service=SENTINEL_SERVICE, prefix="evict")
    adapter = RedisAdapter(cfg)
    try:
        with pytest.raises(ConfigError, match="'volatile-lfu'"):
            await adapter.check_server()
    finally:
        await adapter.close()
        with redis_sentinel.node(port).admin() as primary:
            primary.config_set("maxmemory-policy", "noeviction")


async def test_a_daemon_started_while_redis_is_down_is_refused_once_it_answers(
    tmp_path: Path,
) -> None:
    """Redis down at start: the daemon starts (owning nothing) and checks in the
    background; the server comes up evicting, and the daemon fails with the ConfigError
    (``conveyor worker`` then stops and exits 2)."""
    server = RedisServer(tmp_path, options=("--maxmemory-policy", "allkeys-lru"))
    config = load_config(write_config(tmp_path / "c.toml", server.url,
                                      redis={"retry_max_s": 0.5}), environ={})
    daemon = WorkerDaemon(App("rec"), config)
    try:
        await daemon.start()
        assert daemon.failure is None and daemon.balancer.owned() == []
        server.start()
        await wait_until(daemon.failed.is_set, 20, what="the daemon to check and fail")
        assert isinstance(daemon.failure, ConfigError)
        assert "'allkeys-lru'" in str(daemon.failure)
    finally:
        await daemon.stop()
        server.stop()


async def test_a_policy_nobody_may_read_is_warned_about_not_refused(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """A user allowed neither CONFIG nor INFO: the check cannot tell, so it warns and
    lets the daemon run (refusing would lock out a server set up correctly)."""
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "blind", "on", ">secret", "~*", "&*", "+@all",
                          "-config", "-info")
    url = f"redis://blind:secret@127.0.0.1:{redis_server.port}/0"
    adapter = RedisAdapter(RedisConfig(url=url, prefix="t"))
    try:
        await adapter.check_server()
        assert "could not read maxmemory-policy" in caplog.text
        assert await adapter.eviction_policy() == "unknown"
    finally:
        await adapter.close()


async def test_a_policy_changed_while_the_worker_runs_is_logged_as_an_error(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked at start only, a policy set to evict afterwards went unsaid while the
    worker ran: it is looked at again every SERVER_RECHECK_S, and logged (once per
    change; the daemon runs on)."""
    daemon = rechecking_daemon(redis_server.url, monkeypatch)
    admin = redis_server.client()
    try:
        await daemon.start()
        admin.config_set("maxmemory-policy", "allkeys-lru")
        await wait_until(lambda: "maxmemory-policy is now 'allkeys-lru'" in caplog.text, 10,
                         what="the changed policy to be logged")
        [said] = [r for r in caplog.records if "is now 'allkeys-lru'" in r.getMessage()]
        assert said.levelname == "ERROR" and daemon.failure is None
        admin.config_set("maxmemory-policy", "noeviction")
        await wait_until(lambda: "maxmemory-policy is 'noeviction' again" in caplog.text, 10,
                         what="the safe policy to be logged")
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        await daemon.stop()
