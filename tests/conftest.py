"""Shared test helpers: deadlines instead of sleeps, free ports, the server policy.

Server policy: tests that need a real server (redis-server, the tansu Kafka broker)
start it themselves. If its binary is missing they skip locally, but fail when
``CONVEYOR_REQUIRE_SERVERS=1`` (set by ``.ci/run``), so CI never passes by skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

REQUIRE_SERVERS = os.environ.get("CONVEYOR_REQUIRE_SERVERS") == "1"


def server_missing(what: str) -> None:
    """Skip (locally) or fail (CI) because a server the test needs is unavailable."""
    if REQUIRE_SERVERS:
        pytest.fail(f"{what} is required (CONVEYOR_REQUIRE_SERVERS=1) but unavailable")
    pytest.skip(f"{what} unavailable")


PORTS = range(20_000, 32_000)
"""Where :func:`free_port` picks: below the kernel's ephemeral range (32768-60999 by
default), which ``bind(0)`` and outgoing connections draw from, so only a caller of
free_port() is ever handed one of these."""
_PORT_LOCKS = Path(tempfile.gettempdir()) / "conveyor-test-ports"
_reserved: dict[int, int] = {}
"""Port -> the descriptor holding its lock file, for as long as this process lives."""


def free_port() -> int:
    """A port to start a server on that no other caller on this machine is handed while
    this process lives (not this process again, nor a test run beside it): reserved by
    an exclusive lock on a file named for it, and free to bind now. ``bind(0)`` was not
    enough: its port is free again the moment it returns, so the next call (or another
    run) could be handed the same one before the server bound it."""
    _PORT_LOCKS.mkdir(exist_ok=True)
    first = random.randrange(len(PORTS))
    for i in range(len(PORTS)):
        port = PORTS[(first + i) % len(PORTS)]
        if port in _reserved:
            continue
        fd = os.open(_PORT_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it
            os.close(fd)
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use by something that is not a test
                os.close(fd)
                continue
        _reserved[port] = fd
        return port
    raise RuntimeError(f"no free port left in {PORTS}")



def process_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (SIGSTOP reaches each in turn:
    a server can still answer just after the kill returns)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
               for t in tasks.iterdir())


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
    with reaped(proc):
        try:
            wait_until_sync(condition, timeout_s, what=what)
        except AssertionError as exc:  # what the worker said, to see why
            proc.kill()
            said = proc.communicate()[1] if proc.stderr is not None else ""
            raise AssertionError(f"{exc}; the worker's stderr:\n{said[-4000:]}") from None
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    return stderr


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the block; killed and waited for after it if still running (a failed
    wait or assertion in the block leaves no process behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# The server fixtures (redis_server, tansu, redis_cluster, redis_sentinel and the
# fresh_ ones), shared by tests/contract/ and tests/integration/: tests/servers/.
pytest_plugins = ["tests.servers"]
