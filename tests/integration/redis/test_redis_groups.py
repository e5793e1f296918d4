"""Groups nobody runs on Redis, through the CLI (in a subprocess): rewind refuses an app
with no group (exit 2) and creates none, status names the group that holds retention
back, and deleting it lets trimming resume while a live app's delete is refused.

What every adapter promises about groups (listing, lag, retention holders, delete, dead
letters) is in tests/contract/test_groups.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import Client, Publish, load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import (
    REPO,
    RedisServer,
    Worker,
    wait_file_lines,
    write_config,
)

pytestmark = pytest.mark.redis

PAST = "2000-01-01T00:00:00Z"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def publish(cfg: Path, n: int, start: int = 0) -> None:
    async def run() -> None:
        async with Client.from_config(load_config(cfg, environ={})) as client:
            await client.publish_batch(
                [Publish("items", f"s{i % 10}", {"seq": i}) for i in range(start, start + n)]
            )

    asyncio.run(run())


def group_names(server: RedisServer, queues: int) -> list[set[str]]:
    """The groups on each queue's stream (XINFO GROUPS); empty for a missing stream."""
    client = server.client()
    try:
        return [{g["name"].decode() for g in client.xinfo_groups(f"t:q:{q}")}
                if client.exists(f"t:q:{q}") else set() for q in range(queues)]
    finally:
        client.close()


def stream_length(server: RedisServer, queues: int) -> int:
    client = server.client()
    try:
        return sum(int(client.xlen(f"t:q:{q}")) for q in range(queues))
    finally:
        client.close()


def take_all(cfg: Path, group: str) -> None:
    """App ``group`` reads and acknowledges everything on every queue (no daemon)."""
    from conveyor.adapters.redis import RedisAdapter

    config = load_config(cfg, environ={})

    async def run() -> None:
        adapter = RedisAdapter(config.redis)
        try:
            for q in range(config.queues.total):
                rx = adapter.create_receiver(q, group)
                await rx.initialize()
                while batch := await rx.get_messages(100, 0.05):
                    await rx.acknowledge([m.token for m in batch])  # type: ignore[misc]
        finally:
            await adapter.close()

    asyncio.run(run())


def test_rewinding_an_app_with_no_group_exits_2_and_creates_none(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 4})
    publish(cfg, 40)
    take_all(cfg, "shop")
    refused = cli("rewind", "--app", "shpo", "--to", PAST, "--config", str(cfg))
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.splitlines()
    assert "--app: app 'shpo' has no consumer group on queue(s) 0-3" in line
    assert "--create-group" in line
    assert group_names(redis_server, 4) == [{"shop"}] * 4
    created = cli("rewind", "--app", "shpo", "--to", PAST, "--create-group", "--config", str(cfg))
    assert created.returncode == 0, created.stderr
    assert group_names(redis_server, 4) == [{"shop", "shpo"}] * 4
    again = cli("rewind", "--app", "shop", "--to", PAST, "--queue", "1", "--config", str(cfg))
    assert again.returncode == 0, again.stderr  # an app with a group needs no flag


@pytest.mark.slow
def test_status_lists_every_group_names_the_one_holding_retention_and_warns_on_a_typo(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 2})
    publish(cfg, 30)
    created = cli("rewind", "--app", "ghost", "--to", PAST, "--create-group", "--config", str(cfg))
    assert created.returncode == 0, created.stderr
    take_all(cfg, "live")
    publish(cfg, 5, start=30)

    result = cli("status", "--app", "live", "--json", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    # The group exists, no daemon runs: one line says so (and no typo warning).
    assert result.stderr == ("conveyor: warning: no daemon of --app 'live' is running "
                             "(none registered in [balancer] membership = 'redis')\n")
    report = json.loads(result.stdout)
    assert {"group", "members", "queues", "at"} <= set(report)  # today's object, and more
    assert report["retention_follows_groups"] is True
    ghost, live = report["groups"]
    assert (ghost["group"], ghost["queues"], ghost["lag"]) == ("ghost", [0, 1], 35)
    assert (live["group"], live["queues"], live["lag"]) == ("live", [0, 1], 5)
    assert ghost["holds_retention"] == [0, 1] and live["holds_retention"] == []
    assert ghost["idle_s"] is None  # no consumer of it ever read
    assert live["idle_s"] is not None and live["idle_s"] < 60

    table = cli("status", "--app", "live", "--config", str(cfg))
    assert table.returncode == 0, table.stderr
    assert "2 consumer group(s) on these queues (every app)" in table.stdout
    assert "trimming waits for: ghost" in table.stdout

    typo = cli("status", "--app", "lvie", "--config", str(cfg))
    assert typo.returncode == 0, typo.stderr
    [warning] = typo.stderr.splitlines()
    assert "'lvie' has no consumer group on any queue" in warning
    assert "groups here: ghost, live" in warning
    listed = cli("groups", "list", "--json", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr
    rows = [(g["group"], g["lag"], g["holds_retention"])
            for g in json.loads(listed.stdout)["groups"]]
    assert rows == [("ghost", 35, [0, 1]), ("live", 5, [])]  # the same table, no --app


def test_deleting_the_group_nobody_runs_lets_trimming_resume_and_a_live_app_is_refused(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 2},
                       redis={"retention_s": 0, "trim_interval_s": 0.05},
                       balancer={"lease_ttl_s": 2.0})
    created = cli("rewind", "--app", "ghost", "--to", PAST, "--create-group", "--config", str(cfg))
    assert created.returncode == 0, created.stderr
    worker = Worker("w", cfg, tmp_path)
    workers.append(worker)
    publish(cfg, 200)
    wait_file_lines([worker.record], 200, 30, "the live app handling 200 messages")
    # Everything is acknowledged by the only app that runs, yet the ghost needs it all.
    assert stream_length(redis_server, 2) == 200

    refused = cli("groups", "delete", "--app", "rec", "--config", str(cfg))
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.splitlines()
    assert "app 'rec' looks alive" in line and "--force" in line
    assert group_names(redis_server, 2) == [{"ghost", "rec"}] * 2

    deleted = cli("groups", "delete", "--app", "ghost", "--config", str(cfg))
    assert deleted.returncode == 0, deleted.stderr
    assert "from queue(s) 0-1; dead letters kept" in deleted.stdout
    assert group_names(redis_server, 2) == [{"rec"}] * 2
    publish(cfg, 40, start=200)  # acknowledgements on both queues: each owner trims
    wait_until_sync(lambda: stream_length(redis_server, 2) < 40, 20,
                    "the acknowledged entries trimmed once the ghost is gone")

    forced = cli("groups", "delete", "--app", "rec", "--force", "--config", str(cfg))
    assert forced.returncode == 0, forced.stderr
    unknown = cli("groups", "delete", "--app", "ghost", "--config", str(cfg))
    assert unknown.returncode == 2 and "nothing was deleted" in unknown.stderr
