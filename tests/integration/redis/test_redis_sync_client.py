"""Ctrl-C in a script publishing with ``SyncClient`` to a Redis that stopped answering
(SIGSTOP: the connection stays open, nothing comes back).

The interrupted call raises ``KeyboardInterrupt`` at once, and leaving the ``with`` block
closes the client without sitting out the send's retries (``[redis] retry_max_s``, 10 s
by default): a send nobody waits for is cancelled. What the script published before is
stored; the interrupted message may or may not be (it was never confirmed).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import REPO, write_config
from tests.servers.redis import start_redis

pytestmark = pytest.mark.redis

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


def test_ctrl_c_during_a_stuck_publish_leaves_the_with_block_at_once(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    config = write_config(tmp_path / "c.toml", server.url)
    script = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(config)], cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    redis_proc = server.process.proc
    try:
        assert script.stdout is not None and script.stdin is not None
        assert script.stdout.readline() == "published 1\n"
        redis_proc.send_signal(signal.SIGSTOP)
        script.stdin.write("go\n")
        script.stdin.flush()
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        wait_until_sync(lambda: server_rx_queued(port), 10,
                        "the second publish to reach the stopped server")
        script.send_signal(signal.SIGINT)
        out, err = script.communicate(timeout=30)
    finally:
        redis_proc.send_signal(signal.SIGCONT)
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, err
    assert out.startswith("interrupted, out after "), (out, err)
    took = float(out.split()[-1].rstrip("s"))
    assert took < 3.0, f"closing sat out the send's retries ({took:.2f}s, retry_max_s 10)"
    client = server.client()
    try:
        stored = [fields[b"body"] for q in range(8) for _, fields in client.xrange(f"t:q:{q}")]
    finally:
        client.close()
    server.stop()
    # The confirmed message is stored; the interrupted one may or may not be.
    assert stored in ([b'{"n":1}'], [b'{"n":1}', b'{"n":2}']), stored
