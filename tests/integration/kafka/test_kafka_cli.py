"""The CLI against Kafka as a user runs it: worker, publish, status, rewind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.client import Publish, SyncClient
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.kafka.conftest import Tansu
from tests.servers import RedisServer

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[3]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)


def publish_jobs(cfg: Path, numbers: range) -> None:
    """Jobs for tests/apps/kafka_app.py, in one batch from here: ``conveyor publish``
    itself is the first test's; a process per message (~1 s each) only slowed the rest."""
    with SyncClient.from_config(load_config(cfg, environ={})) as client:
        client.publish_batch(Publish("jobs", f"k{i}", {"id": i, "k": f"k{i}", "seq": 0})
                             for i in numbers)


def config_file(tansu: Tansu, topic: str, tmp_path: Path) -> Path:
    """configs/kafka.toml pointed at the test broker and topic, with two partitions."""
    base = (REPO / "configs" / "kafka.toml").read_text()
    cfg = tmp_path / "kafka.toml"
    cfg.write_text(
        base.replace('bootstrap = "127.0.0.1:9092"', f'bootstrap = "{tansu.bootstrap}"')
        .replace('topic = "conveyor"', f'topic = "{topic}"')
        .replace("total = 8 ", "total = 2 ")
    )
    return cfg


@pytest.mark.slow
def test_worker_publish_status_and_rewind_work_against_kafka(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    cfg = config_file(tansu, topic, tmp_path)
    out = tmp_path / "handled.txt"
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out)}
    token = cli("publish", "jobs", "k1", '{"id": 1, "k": "k1", "seq": 0}', "--config", str(cfg))
    assert token.returncode == 0, token.stderr
    first_token = token.stdout.strip()
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/kafka_app.py:app",
         "--config", str(cfg)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        def handled() -> list[str]:
            return out.read_text().splitlines() if out.exists() else []

        wait_until_sync(lambda: len(handled()) == 1, 30, "the published message handled")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert "drained" in (worker.stderr.read() if worker.stderr else "")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    status = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["queues"][int(first_token.split(":")[0])]["lag"] == 0
    rewound = cli("rewind", "--app", "kafka-sub", "--to", first_token, "--config", str(cfg))
    assert rewound.returncode == 0, rewound.stderr
    status = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
    assert sum(q["lag"] for q in json.loads(status.stdout)["queues"]) == 1


@pytest.mark.slow
def test_rewind_to_a_future_time_is_refused_even_if_forward_is_allowed(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """A time in the future would commit past unhandled ones: exit 2. With
    --allow-forward it was taken, as on Redis, but Kafka keeps no position past a
    partition's end: the group went to the end as it was then, and the messages
    published before the time came were delivered, though the time said to skip them.
    It is refused either way, as a token past the end is; the current time skips what
    is there (exit 0)."""
    cfg = config_file(tansu, topic, tmp_path)
    publish_jobs(cfg, range(3))

    def lag() -> int:
        status = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
        assert status.returncode == 0, status.stderr
        return sum(q["lag"] for q in json.loads(status.stdout)["queues"])

    assert lag() == 3
    future = "2100-01-01T00:00:00Z"
    # The app never ran on this topic: its group is created by the first rewind that moves.
    for extra in ((), ("--allow-forward",)):
        refused = cli("rewind", "--app", "kafka-sub", "--to", future, "--create-group",
                      *extra, "--config", str(cfg))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines() == [
            "conveyor: error: Invalid value for --to: a time in the future: Kafka keeps no "
            "position past a partition's end, so the messages published until then would "
            "be delivered, not skipped; to skip what the queues hold now, give the current "
            "time (with --allow-forward) (see 'conveyor rewind --help')"]
        assert lag() == 3, "a refused rewind moved the position"

    past = cli("rewind", "--app", "kafka-sub", "--to", "2000-01-01T00:00:00Z", "--create-group",
               "--config", str(cfg))
    assert past.returncode == 0, past.stderr
    assert lag() == 3

    now = datetime.now(UTC).isoformat()  # after the messages, to the microsecond
    forced = cli("rewind", "--app", "kafka-sub", "--to", now, "--allow-forward",
                 "--config", str(cfg))
    assert forced.returncode == 0, forced.stderr
    assert lag() == 0, "--allow-forward skips the unhandled messages on purpose"


def test_rewind_to_a_token_past_the_partitions_end_is_refused_even_if_forward_is_allowed(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """Kafka keeps no position past a partition's end (a receiver given one stopped
    reading the partition): exit 2 either way, naming the partition's next offset."""
    cfg = config_file(tansu, topic, tmp_path)
    publish_jobs(cfg, range(3))
    status = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
    assert status.returncode == 0, status.stderr
    lags = {q: info["lag"] for q, info in enumerate(json.loads(status.stdout)["queues"])}
    queue = next(q for q, lag in lags.items() if lag)
    rewind = ["rewind", "--app", "kafka-sub", "--to", f"{queue}:99999999999999",
              "--create-group", "--config", str(cfg)]
    for extra in ((), ("--allow-forward",)):
        refused = cli(*rewind, *extra)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert (f"queue {queue}: offset 99999999999999 is past the end of the partition "
                f"(its next offset is {lags[queue]})") in refused.stderr
    status = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
    assert {q: info["lag"] for q, info in enumerate(json.loads(status.stdout)["queues"])} == lags


def test_rewind_reads_the_leases_a_kafka_app_keeps_in_its_membership_store(
    tansu: Tansu, topic: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    """Under the dynamic balancer a Kafka app's daemons own queues by leases kept in
    Redis, where the Kafka adapter cannot look: ``conveyor rewind`` reads them itself."""
    cfg = config_file(tansu, topic, tmp_path)
    cfg.write_text(
        cfg.read_text().replace('kind = "kafka-group"', 'kind = "dynamic"\nmembership = "redis"')
        + f'\n[redis]\nurl = "{redis_server.url}"\n'
    )

    async def hold_queue_1() -> None:
        _, leases = redis_coordination(load_config(cfg, environ={}), "kafka-sub")
        try:
            assert await leases.acquire(1, "busy-daemon", 60) is not None
        finally:
            await leases.close()

    asyncio.run(hold_queue_1())
    refused = cli("rewind", "--app", "kafka-sub", "--to", "2000-01-01T00:00:00Z",
                  "--config", str(cfg))
    assert refused.returncode == 1, refused.stderr
    assert "still owned (queue 1 by busy-daemon)" in refused.stderr
    assert "Traceback" not in refused.stderr
    held_elsewhere = cli("rewind", "--app", "kafka-sub", "--to", "2000-01-01T00:00:00Z",
                         "--queue", "0", "--config", str(cfg))
    assert "still owned" not in held_elsewhere.stderr, held_elsewhere.stderr


@pytest.mark.slow
def test_status_on_kafka_group_lists_every_running_daemon_and_queue_owner(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """Three daemons on the kafka-group balancer: status --json names each, the queues it
    owns and every queue's owner, from the coordinator and the daemons' reports (tansu's
    DescribeGroups gives member ids only); a daemon that stops drops out at once."""
    cfg = config_file(tansu, topic, tmp_path)
    cfg.write_text(cfg.read_text().replace("total = 2 ", "total = 4 "))
    out = tmp_path / "handled.txt"
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out)}
    workers = [subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/kafka_app.py:app",
         "--config", str(cfg)], cwd=REPO, env=env, stderr=subprocess.DEVNULL, text=True,
    ) for _ in range(3)]
    seen: dict[str, Any] = {}

    def settled(daemons: int) -> bool:
        result = cli("status", "--app", "kafka-sub", "--json", "--config", str(cfg))
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        owned = sorted(q for m in doc["members"] for q in m["queues"])
        seen.update(doc=doc, stderr=result.stderr)
        return len(doc["members"]) == daemons and owned == [0, 1, 2, 3]

    try:
        wait_until_sync(lambda: settled(3), 60, "three daemons sharing the four queues")
        doc = seen["doc"]
        pids = {w.pid for w in workers}
        assert {m["pid"] for m in doc["members"]} == pids
        assert all(m["queues"] for m in doc["members"]), "each of three owns one of four"
        owner_of = {q: m["id"] for m in doc["members"] for q in m["queues"]}
        assert {q["queue"]: q["owner"] for q in doc["queues"]} == owner_of
        assert "warning" not in seen["stderr"], seen["stderr"]
        # rewind sees the same owners (tansu reports no assignments: the daemons' reports).
        refused = cli("rewind", "--app", "kafka-sub", "--to", "2000-01-01T00:00:00Z",
                      "--create-group", "--config", str(cfg))
        assert refused.returncode == 1, refused.stderr
        assert f"queue 0 by {owner_of[0]}" in refused.stderr, refused.stderr
        # They do handle: every message published, once (no re-balance runs meanwhile).
        publish_jobs(cfg, range(12))
        wait_until_sync(lambda: out.exists() and len(out.read_text().splitlines()) >= 12, 30,
                        "the 12 messages handled")
        handled = sorted(int(line.split()[0]) for line in out.read_text().splitlines())
        assert handled == list(range(12))
        gone = workers.pop()
        gone.send_signal(signal.SIGTERM)
        assert gone.wait(30) == 0
        wait_until_sync(lambda: settled(2), 60, "the two daemons left to share the queues")
        assert {m["pid"] for m in seen["doc"]["members"]} == {w.pid for w in workers}
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)


@pytest.mark.parametrize("suffix", ["conveyor-dlq", "conveyor-dlq-ops"])
def test_status_and_dlq_end_on_an_empty_dead_letter_topic(
    tansu: Tansu, topic: str, tmp_path: Path, suffix: str
) -> None:
    # A dead-letter topic created ahead (by a deployment's tooling, say) and still empty:
    # the reader re-assigned its partition for a read of nothing and was stopped at once,
    # a race in aiokafka's fetcher that swallows the stop: status and dlq list hung.
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(f"{topic}.{suffix}", 1, 1)])
        finally:
            await admin.close()

    asyncio.run(create())
    cfg = str(config_file(tansu, topic, tmp_path))
    for _ in range(3):  # a race: each run had about even odds
        listed = cli("dlq", "list", "--app", "shop", "--config", cfg, "--json")
        status = cli("status", "--app", "shop", "--config", cfg, "--json")
        assert (listed.returncode, listed.stdout) == (0, "[]\n"), listed.stderr
        assert (status.returncode, json.loads(status.stdout)["dead_letters"]) == (0, 0), (
            status.stderr)


def test_reading_commands_create_no_topic_and_say_it_is_missing(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """A typo in ``[kafka] topic`` (or an app that never ran): ``status`` created the
    topic it read the lag of, and said nothing of it."""
    from aiokafka.admin import AIOKafkaAdminClient

    cfg = config_file(tansu, topic, tmp_path)
    missing = (f"conveyor: warning: kafka topic {topic!r} does not exist: nothing was "
               "published and no worker ran under this config (check $.kafka.topic)")
    for args in (["status", "--app", "TYPO"], ["status"], ["dlq", "list", "--app", "TYPO"]):
        result = cli(*args, "--config", str(cfg))
        assert result.returncode == 0, result.stderr
        assert missing in result.stderr.splitlines(), (args, result.stderr)
    rewound = cli("rewind", "--app", "TYPO", "--to", "0:0", "--config", str(cfg))
    assert rewound.returncode != 0 and "Traceback" not in rewound.stderr, rewound.stderr

    async def topics() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    assert [t for t in asyncio.run(topics()) if t.startswith(topic)] == []
