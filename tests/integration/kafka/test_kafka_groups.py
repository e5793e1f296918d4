"""Groups nobody runs on Kafka, through the CLI (in a subprocess, tansu broker): status
lists every group of the topic and says no group holds retention; `groups delete`
refuses a group that also reads another topic, or one whose daemon runs.

What every adapter promises about groups (listing, lag, rewind creating none, delete,
dead letters kept or refused) is in tests/contract/test_groups.py; the CLI's refusal of
a rewind with no group in tests/integration/redis/test_redis_groups.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.conftest import wait_until_sync
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.test_kafka_cli import REPO, cli, config_file, publish_jobs

pytestmark = [pytest.mark.kafka]

PAST = "2000-01-01T00:00:00Z"


def committed(tansu: Tansu, topic: str, group: str) -> tuple[bool, dict[int, int]]:
    """(whether the broker lists the group, its committed offsets on the topic's 2 queues)."""
    async def read() -> tuple[bool, dict[int, int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            listed = group in {g[0] for g in await admin.list_consumer_groups()}
            offsets = await admin.list_consumer_group_offsets(
                group, partitions=[TopicPartition(topic, q) for q in range(2)])
            return listed, {tp.partition: o.offset for tp, o in offsets.items() if o.offset >= 0}
        finally:
            await admin.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_status_lists_every_group_of_the_topic_and_no_group_holds_retention(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    cfg = config_file(tansu, topic, tmp_path)
    behind, ahead = f"behind-{uuid.uuid4().hex[:6]}", f"ahead-{uuid.uuid4().hex[:6]}"
    publish_jobs(cfg, range(3))
    # "ahead": moved past everything published, by the current time (a future one is
    # refused on Kafka, which keeps no position past a partition's end).
    now = datetime.now(UTC).isoformat()
    for app, to in ((behind, [PAST]), (ahead, [now, "--allow-forward"])):
        done = cli("rewind", "--app", app, "--to", *to, "--create-group", "--config", str(cfg))
        assert done.returncode == 0, done.stderr

    result = cli("status", "--app", behind, "--json", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    # The group exists, no daemon runs: one line says so (and no typo warning).
    assert result.stderr == (f"conveyor: warning: no daemon of --app '{behind}' is running "
                             "(none in its Kafka group, none reporting to the members topic)\n")
    report = json.loads(result.stdout)
    assert report["retention_follows_groups"] is False
    rows = {g["group"]: (g["queues"], g["lag"], g["holds_retention"]) for g in report["groups"]}
    assert rows == {behind: ([0, 1], 3, []), ahead: ([0, 1], 0, [])}
    assert all(g["members"] == 0 for g in report["groups"])  # nobody runs either app

    table = cli("status", "--app", behind, "--config", str(cfg))
    assert "retention goes by time or size here: no group holds it back" in table.stdout
    typo = cli("status", "--app", "no-such-app", "--config", str(cfg))
    assert typo.returncode == 0, typo.stderr
    assert "'no-such-app' has no consumer group on any queue" in typo.stderr

    # Without --app: both apps, from the broker's groups, none with a daemon running.
    apps = cli("status", "--json", "--config", str(cfg))
    assert apps.returncode == 0, apps.stderr
    found = {a["app"]: (a["daemons"], a["lag"]) for a in json.loads(apps.stdout)["apps"]}
    assert found == {behind: (0, 3), ahead: (0, 0)}


@pytest.mark.slow
def test_groups_delete_removes_a_ghost_and_refuses_an_app_whose_daemon_runs(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    cfg = config_file(tansu, topic, tmp_path)
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    publish_jobs(cfg, range(1))
    created = cli("rewind", "--app", ghost, "--to", PAST, "--create-group", "--config", str(cfg))
    assert created.returncode == 0, created.stderr
    deleted = cli("groups", "delete", "--app", ghost, "--config", str(cfg))
    assert deleted.returncode == 0, deleted.stderr
    assert "from queue(s) 0-1" in deleted.stdout
    assert committed(tansu, topic, ghost) == (False, {})

    # Kafka groups span topics: one that also reads another topic is not deleted here.
    (tmp_path / "b").mkdir()
    other = config_file(tansu, f"{topic}-b", tmp_path / "b")
    for config in (cfg, other):
        done = cli("rewind", "--app", ghost, "--to", PAST, "--create-group",
                   "--config", str(config))
        assert done.returncode == 0, done.stderr
    shared = cli("groups", "delete", "--app", ghost, "--config", str(cfg))
    assert shared.returncode == 1 and f"['{topic}-b']" in shared.stderr, shared.stderr
    assert committed(tansu, topic, ghost) == (True, {0: 0, 1: 0})

    out = tmp_path / "handled.txt"
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/kafka_app.py:app",
         "--config", str(cfg)], cwd=REPO, env={**os.environ, "CONVEYOR_TEST_OUT": str(out)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_sync(lambda: out.exists() and out.read_text().count("\n") == 1, 30,
                        "the kafka-group worker handling the message")
        # Its commit makes the group the topic's; its membership says it runs.
        wait_until_sync(lambda: committed(tansu, topic, "kafka-sub")[1] != {}, 10,
                        "the worker's commit")
        refused = cli("groups", "delete", "--app", "kafka-sub", "--config", str(cfg))
        assert refused.returncode == 1, refused.stderr
        assert "looks alive" in refused.stderr and "member(s)" in refused.stderr
        assert committed(tansu, topic, "kafka-sub")[0]
    finally:
        worker.kill()
        worker.wait(10)
