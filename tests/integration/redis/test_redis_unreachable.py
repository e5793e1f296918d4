"""A Redis Cluster or a Sentinel-managed Redis that cannot be reached: as with one server,
the calls are retried for ``[redis] retry_max_s``, noted once, and a one-shot command
fails in one line (exit 1), never a traceback; a worker waits the outage out.

No server is started: the configs point at a port nobody listens on.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration.redis.conftest import REPO, RedisServer, Worker, write_config

RETRY_MAX_S = 1.0

COMMANDS = [["status"], ["publish", "orders", "k1", "{}"], ["dlq", "list", "--app", "rec"],
            ["groups", "list"]]


def conveyor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def cluster_config(tmp: Path, port: int) -> Path:
    return write_config(tmp / "cluster.toml", f"redis://127.0.0.1:{port}/0",
                        redis={"mode": "cluster", "retry_max_s": RETRY_MAX_S})


def sentinel_config(tmp: Path, ports: list[int]) -> Path:
    return write_config(tmp / "sentinel.toml", "redis:///0", redis={
        "mode": "sentinel", "sentinels": [f"127.0.0.1:{p}" for p in ports],
        "sentinel_service": "mymaster", "retry_max_s": RETRY_MAX_S})


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_unreachable_cluster_is_retried_then_one_line(tmp_path: Path,
                                                         command: list[str]) -> None:
    """redis-py says "Redis Cluster cannot be connected" with a RedisClusterException,
    no RedisError: it went unmapped, unretried, and every command ended in a traceback."""
    port = free_port()
    started = time.monotonic()
    result = conveyor(*command, "--config", str(cluster_config(tmp_path, port)))
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    note, error = result.stderr.splitlines()
    assert f"redis at redis://127.0.0.1:{port}/0 unreachable while " in note, note
    assert note.endswith(f"retrying with back-off for up to {RETRY_MAX_S:g}s a call "
                         "([redis] retry_max_s)"), note
    assert error.startswith("conveyor: error: redis unreachable while "), error
    assert f"no node of the cluster answered (tried 127.0.0.1:{port})" in error, error
    assert took >= RETRY_MAX_S, f"gave up after {took:.2f}s, before retry_max_s"


def test_a_worker_waits_out_an_unreachable_cluster(tmp_path: Path,
                                                   workers: list[Worker]) -> None:
    """The daemon died at its first call; now it retries as on one server."""
    port = free_port()
    w = Worker("w", cluster_config(tmp_path, port), tmp_path)
    workers.append(w)
    deadline = time.monotonic() + 30
    while "unreachable" not in w.stderr and w.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3 * RETRY_MAX_S)  # past retry_max_s: still waiting, not dead
    assert w.alive(), w.stderr
    assert "no node of the cluster answered" in w.stderr, w.stderr
    assert w.stop() == 0, w.stderr
    assert "Traceback" not in w.stderr, w.stderr


def test_a_cluster_config_on_a_server_not_in_cluster_mode_is_a_config_error(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Not an outage (no retry): the server named, in one line. It exited 1, as the
    broker's failure; but the server is fine and the config names no cluster, so it is a
    bad setting, named as one (exit 2) as a database the server lacks is."""
    result = conveyor("status", "--config",
                      str(cluster_config(tmp_path, redis_server.port)))
    assert result.returncode == 2, result.stderr
    [error] = result.stderr.splitlines()
    assert error == (f'conveyor: error: config: $.redis.mode: "cluster", but '
                     f"127.0.0.1:{redis_server.port}: Cluster mode is not enabled on this "
                     f"node (while reading the groups of queue 0): point $.redis.url at a "
                     f'node of a cluster, or set mode = "standalone"'), error


@pytest.mark.parametrize("command", [*COMMANDS, ["worker", "tests.apps.recorder:app"]],
                         ids=lambda c: " ".join(c[:2]))
def test_a_database_number_the_server_lacks_is_a_config_error_naming_the_url(
        redis_server: RedisServer, tmp_path: Path, command: list[str]) -> None:
    """`/99` on a server with 16 databases: every call failed with "DB index is out of
    range", reported as the broker's failure (exit 1) after warnings that CONFIG and INFO
    were refused; it is the config's mistake, named as such, in one line (exit 2)."""
    path = write_config(tmp_path / "db.toml", f"redis://127.0.0.1:{redis_server.port}/99")
    result = conveyor(*command, "--config", str(path))
    assert result.returncode == 2, result.stderr
    [error] = result.stderr.splitlines()
    assert error.startswith("conveyor: error: config: $.redis.url: the server has no "
                            "database of that number (DB index is out of range, while "), error
    assert error.endswith("a Redis server has `databases` of them, 16 by default, numbered "
                          "from 0"), error


def test_unreachable_sentinels_are_named_in_a_short_line(tmp_path: Path) -> None:
    """redis-py names each sentinel that failed by its client's repr (every connection
    option): the error was one line of ~3,250 characters, the warning before it too."""
    ports = [free_port() for _ in range(3)]
    result = conveyor("status", "--config", str(sentinel_config(tmp_path, ports)))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    note, error = result.stderr.splitlines()
    assert error.startswith("conveyor: error: redis unreachable while "), error
    assert "the sentinels named no primary for 'mymaster' (" in error, error
    for line in (note, error):
        assert "<redis." not in line and "REDACTED" not in line, line
        assert all(f"127.0.0.1:{p}" in line for p in ports), line
        assert len(line) < 600, (len(line), line)
