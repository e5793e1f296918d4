"""Ctrl-C in a script publishing with ``SyncClient`` to a broker that stopped answering
(SIGSTOP: the connection stays open, nothing comes back).

The interrupted call raises ``KeyboardInterrupt`` at once, and leaving the ``with`` block
closes the client without sitting out the send's retries or timeouts (Redis: ``[redis]
retry_max_s``, 10 s; Kafka: the producer's request timeout, 40 s): a send nobody waits
for is cancelled. What the script published before is stored; the interrupted message
may or may not be (it was never confirmed).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.config_files import write_toml
from tests.conftest import process_stopped, wait_until_sync
from tests.integration.kafka.helpers import read_all
from tests.integration.redis.conftest import REPO
from tests.servers.redis import start_redis
from tests.servers.tansu import start_tansu

QUEUES = 2

SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
from conveyor.client import SyncClient
from conveyor.platform.config import load_config

started = time.monotonic()
try:
    with SyncClient.from_config(load_config(sys.argv[1], environ={})) as client:
        client.publish("orders", "k", {"n": 1})
        print("published 1", flush=True)
        sys.stdin.readline()  # the test stops the server, then says go
        started = time.monotonic()
        client.publish("orders", "k", {"n": 2})
        print("published 2", flush=True)
except KeyboardInterrupt:
    print(f"interrupted, out after {time.monotonic() - started:.2f}s", flush=True)
"""


def server_rx_queued(port: int) -> bool:
    """Bytes wait unread on a socket of the server's port (/proc/net/tcp): a stopped
    server's kernel still takes a client's request in."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, _, _, queues = line.split()[1:5]
        if int(local.split(":")[1], 16) == port and int(queues.split(":")[1], 16) > 0:
            return True
    return False


@pytest.mark.parametrize("name", [pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("kafka", marks=pytest.mark.kafka)])
def test_ctrl_c_during_a_stuck_publish_leaves_the_with_block_at_once(
    name: str, tmp_path: Path
) -> None:
    if name == "redis":
        redis = start_redis(tmp_path / "redis")
        stop_server, port = redis.stop, redis.process.port
        server = redis.process.proc
        config = write_toml(tmp_path / "c.toml", {
            "queues": {"adapter": "redis", "total": QUEUES},
            "redis": {"url": redis.url, "prefix": "t"},
            "balancer": {"kind": "dynamic", "membership": "redis"}})
    else:
        tansu = start_tansu(tmp_path)
        stop_server, port, server = tansu.stop, tansu.port, tansu.proc
        config = write_toml(tmp_path / "c.toml", {
            "queues": {"adapter": "kafka", "total": QUEUES},
            "kafka": {"bootstrap": tansu.bootstrap, "topic": "orders-t"}})
    assert server is not None
    script = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(config)], cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert script.stdout is not None and script.stdin is not None
        first = script.stdout.readline()
        assert first == "published 1\n", script.communicate(timeout=30)
        server.send_signal(signal.SIGSTOP)
        wait_until_sync(lambda: process_stopped(server.pid), 10, "the server to stop")
        script.stdin.write("go\n")
        script.stdin.flush()
        try:
            wait_until_sync(lambda: server_rx_queued(port), 30,
                            "the second publish to reach the stopped server")
        except AssertionError as exc:  # what the script did meanwhile
            script.kill()
            raise AssertionError(f"{exc}: {script.communicate()}") from None
        script.send_signal(signal.SIGINT)
        out, err = script.communicate(timeout=60)
    finally:
        server.send_signal(signal.SIGCONT)
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, err
    assert out.startswith("interrupted, out after "), (out, err)
    took = float(out.split()[-1].rstrip("s"))
    assert took < 3.0, f"closing sat out the send's retries ({took:.2f}s)"
    try:
        if name == "redis":
            client = redis.client()
            try:
                stored = [fields[b"body"] for q in range(QUEUES)
                          for _, fields in client.xrange(f"t:q:{q}")]
            finally:
                client.close()
        else:
            records = asyncio.run(read_all(tansu.bootstrap, "orders-t", 1, QUEUES))
            stored = [record.value for record in records]
    finally:
        stop_server()
    # The confirmed message is stored; the interrupted one may or may not be.
    assert stored in ([b'{"n":1}'], [b'{"n":1}', b'{"n":2}']), stored
