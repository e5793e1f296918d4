"""Shared test helpers: deadlines instead of sleeps, free ports, the server policy.

Server policy: tests that need a real server (redis-server, the tansu Kafka broker)
start it themselves. If its binary is missing they skip locally, but fail when
``CONVEYOR_REQUIRE_SERVERS=1`` (set by ``.ci/run``), so CI never passes by skipping.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable

import pytest

REQUIRE_SERVERS = os.environ.get("CONVEYOR_REQUIRE_SERVERS") == "1"


def server_missing(what: str) -> None:
    """Skip (locally) or fail (CI) because a server the test needs is unavailable."""
    if REQUIRE_SERVERS:
        pytest.fail(f"{what} is required (CONVEYOR_REQUIRE_SERVERS=1) but unavailable")
    pytest.skip(f"{what} unavailable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


def wait_until_sync(
    condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def stop_when(
    proc: subprocess.Popen[str], condition: Callable[[], bool], timeout_s: float, what: str
) -> str:
    """Wait for ``condition``, stop the worker with SIGTERM (it flushes its exporters),
    assert a clean exit and return its stderr; the process never outlives the call."""
    try:
        wait_until_sync(condition, timeout_s, what=what)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    return stderr


# The server fixtures (redis_server, tansu, redis_cluster, redis_sentinel and the
# fresh_ ones), shared by tests/contract/ and tests/integration/: tests/servers/.
pytest_plugins = ["tests.servers"]
