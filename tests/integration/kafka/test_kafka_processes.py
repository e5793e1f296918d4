"""Worker processes on Kafka alone (kafka-group balancer): kill one, lose nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from conveyor.client import Client, Publish
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 6
CACHE = 64


def write_config(path: Path, bootstrap: str, topic: str) -> Path:
    path.write_text(
        f"""
[queues]
adapter = "kafka"
total = {PARTITIONS}

[kafka]
bootstrap = "{bootstrap}"
topic = "{topic}"
session_timeout_ms = 6000
heartbeat_interval_ms = 500

[balancer]
kind = "kafka-group"

[slots]
count = 4

[worker]
cache_capacity = {CACHE}
poll_timeout_ms = 200
drain_timeout_s = 5
"""
    )
    return path


def start_worker(config: Path, out: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_SLEEP_MS": "4"}
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/kafka_app.py:app",
             "--config", str(config)],
            cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT,
        )


async def group_members(bootstrap: str, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
        groups = described[0].groups
        if not groups or groups[0][2] != "Stable":
            return 0
        return len(groups[0][5])
    finally:
        await admin.close()


def read_lines(out: Path) -> list[list[str]]:
    if not out.exists():
        return []
    return [line.split() for line in out.read_text().splitlines() if line.count(" ") == 3]


async def test_a_killed_daemons_partitions_resume_elsewhere_without_loss(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    config_path = write_config(tmp_path / "kafka.toml", tansu.bootstrap, topic)
    config = kafka_config(tansu.bootstrap, topic, queues={"total": PARTITIONS})
    out = tmp_path / "handled.txt"
    procs = [start_worker(config_path, out, tmp_path / f"w{i}.log") for i in range(3)]
    try:
        await wait_until(lambda: _members_are(tansu.bootstrap, 3), 60, 0.3,
                         "three members, stable")
        n = 4000
        async with Client.from_config(config) as client:
            await client.publish_batch(
                [Publish("jobs", f"k{i % 200}", {"id": i, "k": f"k{i % 200}", "seq": i // 200})
                 for i in range(n)]
            )
        victim = procs[0]
        await wait_until(
            lambda: sum(1 for r in read_lines(out) if r[3] == str(victim.pid)) > 50,
            60, 0.05, "the victim at work",
        )
        handled_before_kill = len(read_lines(out))
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert handled_before_kill < n, "the run ended before the kill; make it longer"
        await wait_until(lambda: len({r[0] for r in read_lines(out)}) == n, 90, 0.2,
                         "every message handled")
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc in procs[1:]:
            assert proc.wait(30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    lines = read_lines(out)
    counts = Counter(r[0] for r in lines)
    duplicates = sum(c - 1 for c in counts.values())
    # Only what the victim held (pulled, not committed) may run twice: at most its
    # cache on each of its partitions.
    bound = CACHE * PARTITIONS // 3 + CACHE
    assert duplicates <= bound, f"{duplicates} duplicates > bound {bound}"
    by_key: dict[str, list[int]] = {}
    for r in lines:
        by_key.setdefault(r[1], []).append(int(r[2]))
    for key, seqs in by_key.items():  # order per key holds up to replays
        firsts = list(dict.fromkeys(seqs))
        assert firsts == sorted(firsts), key


async def _members_are(bootstrap: str, want: int) -> bool:
    return await group_members(bootstrap, "kafka-sub") == want
