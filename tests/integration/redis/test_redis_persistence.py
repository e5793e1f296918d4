"""A Redis that keeps nothing across a restart (``save ""`` and ``appendonly no``) is
reported, never refused: a worker starts and warns, once, naming the server; ``conveyor
status`` shows ``persistence none`` and warns. RDB snapshots alone (a crash loses the
last writes) are a weaker note: an info line at start, ``persistence rdb`` in status, no
warning; AOF says nothing. Where ``CONFIG`` is forbidden, ``INFO persistence`` tells AOF
but not the save schedule: ``unknown``, warned about. Cluster: every primary is read;
Sentinel: the primary it names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import RedisConfig
from tests.conftest import wait_until, wait_until_sync
from tests.integration.redis.conftest import (
    Worker,
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

NO_PERSISTENCE = "keeps no data across a restart"


@pytest.fixture
def bare_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server started with ``--save "" --appendonly no``: it keeps nothing."""
    server = RedisServer(tmp_path / "bare")
    server.start()
    yield server
    server.stop()


def test_a_worker_on_a_server_without_persistence_warns_once_and_runs(
    bare_redis: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    worker = Worker("w", write_config(tmp_path / "c.toml", bare_redis.url), tmp_path,
                    log_level="warning")
    workers.append(worker)
    wait_until_sync(lambda: "ready" in worker.stderr or not worker.alive(), 30,
                    "the worker ready")
    assert worker.stop() == 0, worker.stderr
    [line] = [x for x in worker.stderr.splitlines() if NO_PERSISTENCE in x]
    assert f"redis at {bare_redis.url} keeps no data" in line, line
    assert "a restart loses every queued and pending message" in line, line
    assert "appendonly yes" in line, line


def test_a_worker_on_an_aof_server_says_nothing_of_persistence(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    worker = Worker("w", write_config(tmp_path / "c.toml", redis_server.url), tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: "ready" in worker.stderr or not worker.alive(), 30,
                    "the worker ready")
    assert worker.stop() == 0, worker.stderr
    assert "persist" not in worker.stderr and NO_PERSISTENCE not in worker.stderr


async def test_rdb_snapshots_alone_are_an_info_line_not_a_warning(
    bare_redis: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    bare_redis.client().config_set("save", "3600 1 300 100")
    adapter = RedisAdapter(RedisConfig(url=bare_redis.url, prefix="t"))
    try:
        with caplog.at_level(logging.INFO, logger="conveyor.redis"):
            await adapter.check_server()
        assert await adapter.persistence() == "rdb"
    finally:
        await adapter.close()
    [note] = [r for r in caplog.records if "persist" in r.getMessage()]
    assert note.levelno == logging.INFO
    assert "RDB snapshots only: a crash loses what was published since" in note.getMessage()


def test_status_shows_persistence_and_warns_of_none_only(
    bare_redis: RedisServer, redis_server: RedisServer, tmp_path: Path,
) -> None:
    report, err = status_json(write_config(tmp_path / "bare.toml", bare_redis.url))
    assert report["persistence"] == "none"
    [warning] = [x for x in err.splitlines() if "persistence" in x]
    assert warning == ('conveyor: warning: Redis persistence is none (save "", appendonly '
                       "no): a restart loses every queued and pending message "
                       '(docs/redis.md, "Persistence")')
    bare_redis.client().config_set("save", "60 1")
    report, err = status_json(write_config(tmp_path / "bare.toml", bare_redis.url))
    assert report["persistence"] == "rdb" and "persistence" not in err, err
    report, err = status_json(write_config(tmp_path / "aof.toml", redis_server.url))
    assert report["persistence"] == "aof" and "persistence" not in err, err


def forbid(server: RedisServer, *commands: str) -> str:
    """A URL of a user who may not run ``commands`` (as on managed services)."""
    server.client().execute_command("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*",
                                    "+@all", *(f"-{c}" for c in commands))
    return f"redis://app:secret@127.0.0.1:{server.port}/0"


async def test_where_config_is_forbidden_info_tells_aof_and_else_it_is_unknown(
    bare_redis: RedisServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """INFO persistence has ``aof_enabled`` but no save schedule: with AOF off, ``rdb``
    and ``none`` look alike, so it is ``unknown`` and warned about."""
    for server, expected in ((redis_server, "aof"), (bare_redis, "unknown")):
        adapter = RedisAdapter(RedisConfig(url=forbid(server, "config"), prefix="t"))
        try:
            with pytest.raises(Exception, match="no permissions"):
                await adapter.redis.config_get("save")  # the premise
            await adapter.check_server()
            assert await adapter.persistence() == expected
        finally:
            await adapter.close()
    [warning] = [r.getMessage() for r in caplog.records if "persistence of" in r.getMessage()]
    assert "could not read the persistence of redis at redis://app:" in warning
    assert f":{bare_redis.port}/0 (CONFIG GET refused" in warning


async def test_a_server_refusing_config_and_info_is_unknown_and_warned_about(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = RedisAdapter(RedisConfig(url=forbid(redis_server, "config", "info"),
                                       prefix="t"))
    try:
        await adapter.check_server()  # warns, never refuses
        assert await adapter.persistence() == "unknown"
    finally:
        await adapter.close()
    assert "could not read the persistence of redis" in caplog.text


async def test_every_primary_of_a_cluster_is_read(
    redis_cluster: RedisClusterServers, caplog: pytest.LogCaptureFixture,
) -> None:
    primaries = redis_cluster.primaries()
    kept = primaries[1][1]
    with redis_cluster.node(kept).admin() as one:
        one.config_set("appendonly", "yes")
    adapter = RedisAdapter(RedisConfig(url=redis_cluster.url, mode="cluster",
                                       prefix="persist"))
    try:
        await adapter.check_server()
        summary = await adapter.persistence()
        assert summary is not None and f":{kept}=aof" in summary, summary
        assert summary.count("=none") == len(primaries) - 1, summary
    finally:
        await adapter.close()
        with redis_cluster.node(kept).admin() as one:
            one.config_set("appendonly", "no")
    [warning] = [r.getMessage() for r in caplog.records if NO_PERSISTENCE in r.getMessage()]
    named = warning.split(" keeps no data")[0]
    assert f":{kept}" not in named
    assert all(f":{port}" in named for _, port in primaries if port != kept), warning


async def test_a_sentinel_managed_primary_is_read(
    redis_sentinel: RedisSentinelServers,
) -> None:
    _, port = redis_sentinel.primary()
    cfg = RedisConfig(url="redis:///0", mode="sentinel", sentinels=redis_sentinel.addresses,
                      sentinel_service=SENTINEL_SERVICE, prefix="persist")
    adapter = RedisAdapter(cfg)
    try:
        assert await adapter.persistence() == "none"
        with redis_sentinel.node(port).admin() as primary:
            primary.config_set("appendonly", "yes")
        assert await adapter.persistence() == "aof"
    finally:
        await adapter.close()
        with redis_sentinel.node(port).admin() as primary:
            primary.config_set("appendonly", "no")


async def test_a_process_says_it_once_for_daemon_after_daemon_on_one_server(
    bare_redis: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    # A worker under --reload, or a benchmark's repeats, start one daemon after another:
    # each checks the server, the process warns the first time only.
    with caplog.at_level(logging.WARNING, logger="conveyor.redis"):
        for _ in range(3):
            adapter = RedisAdapter(RedisConfig(url=bare_redis.url, prefix="t"))
            try:
                await adapter.check_server()
            finally:
                await adapter.close()
    said = [r.getMessage() for r in caplog.records if "keeps no data" in r.getMessage()]
    assert len(said) == 1 and bare_redis.url in said[0], said


async def test_persistence_turned_off_while_the_worker_runs_is_a_warning(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read at start only, a server switched to keep nothing afterwards (``CONFIG SET
    appendonly no``, ``save ""``) went unsaid while the worker ran: a restart then lost
    every queued message, and nothing had said it could. It is read again every
    SERVER_RECHECK_S with the eviction policy, and warned about as at start; once a
    change, and again when it changes back and off once more."""
    daemon = rechecking_daemon(redis_server.url, monkeypatch)
    admin = redis_server.client()

    def warned() -> list[logging.LogRecord]:
        return [r for r in caplog.records if NO_PERSISTENCE in r.getMessage()]

    try:
        await daemon.start()
        assert not warned()  # AOF at start: nothing said
        admin.config_set("appendonly", "no")
        admin.config_set("save", "")
        await wait_until(lambda: len(warned()) == 1, 10, what="the change warned about")
        [said] = warned()
        assert said.levelname == "WARNING" and daemon.failure is None
        assert f"redis at {redis_server.url} keeps no data across a restart" in \
            said.getMessage()
        await asyncio.sleep(0.3)  # several looks more: said once
        assert len(warned()) == 1
        admin.config_set("appendonly", "yes")
        await asyncio.sleep(0.3)
        admin.config_set("appendonly", "no")
        await wait_until(lambda: len(warned()) == 2, 10, what="the second change warned about")
    finally:
        admin.config_set("appendonly", "yes")
        await daemon.stop()
