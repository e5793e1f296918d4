"""One ``redis-server`` (Debian package ``redis-server``): :class:`RedisProcess`, the
process every Redis kind here is made of, and :class:`RedisServer` / ``redis_server``, a
server per test in its temp dir that can be restarted in place (same port, same
directory, AOF kept) to test that daemons ride out a broker restart."""

from __future__ import annotations

import signal
from pathlib import Path

import redis

from tests.conftest import free_port
from tests.servers.process import Process, require, server_fixture, wait_answering

Address = tuple[str, int]
"""(host, port) of a node, as CLUSTER SLOTS and the sentinels name it."""

REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
"""What a node that is starting, loading or gone answers: "not yet" while waiting."""


class RedisProcess(Process):
    """One ``redis-server`` on ``port`` with its directory and log ``workdir/redis.log``;
    ``args`` are the options after the server's own (port, bind, dir, log file). A
    sentinel is one too: ``redis-server sentinel.conf --sentinel`` (Debian ships no
    ``redis-sentinel``), its options in ``config_file``."""

    def __init__(self, port: int, workdir: Path, *args: str,
                 config_file: Path | None = None, password: str | None = None) -> None:
        if config_file is None:
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                    "--dir", str(workdir), "--daemonize", "no",
                    "--logfile", str(workdir / "redis.log"), *args]
        else:
            argv = ["redis-server", str(config_file), *args]
        super().__init__(argv, workdir / "redis.log")
        self.port = port
        self.workdir = workdir
        self.password = password
        """What :meth:`admin` authenticates with (the process's ``requirepass``)."""
        self._admin: redis.Redis | None = None

    @property
    def address(self) -> Address:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spawn()

    def admin(self) -> redis.Redis:
        """A plain connection to this process (kept; decoded replies), for PING, INFO,
        CLUSTER and SENTINEL commands."""
        if self._admin is None:
            self._admin = redis.Redis(port=self.port, password=self.password,
                                      decode_responses=True, socket_connect_timeout=0.5,
                                      socket_timeout=2)
        return self._admin

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def stop(self, sig: signal.Signals = signal.SIGKILL, timeout_s: float = 10.0) -> None:
        super().stop(sig, timeout_s)
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def answers(self) -> bool:
        return bool(self.admin().ping())


class RedisServer:
    """A standalone ``redis-server`` on a free port in ``workdir``; with ``aof`` every
    write is fsynced to an append-only file, so a restart in place keeps the data."""

    def __init__(self, workdir: Path, *, aof: bool = False, options: tuple[str, ...] = ()
                 ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.aof = aof
        self.options = options
        """More ``redis-server`` arguments (``("--maxmemory-policy", "allkeys-lru")``)."""
        self.process = self._process()

    def _process(self) -> RedisProcess:
        """Built anew on each start, so a test may change ``aof`` between a stop and a
        start (a restart that keeps nothing)."""
        durable = ("--appendonly", "yes", "--appendfsync", "always") if self.aof else ()
        return RedisProcess(self.port, self.workdir, "--save", "", *durable, *self.options)

    @property
    def url(self) -> str:
        return self.process.url

    def start(self) -> None:
        self.process = self._process()
        self.process.start()
        wait_answering(self.process.answers, 10, "redis-server to accept connections",
                       processes=[self.process], errors=REDIS_ERRORS)

    def stop(self) -> None:
        """SIGTERM: redis flushes its AOF and exits."""
        self.process.stop(signal.SIGTERM)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


def start_redis(workdir: Path, *, aof: bool = False) -> RedisServer:
    """A :class:`RedisServer`, started (skipped or failed if redis-server is missing)."""
    require("redis-server", "redis-server")
    server = RedisServer(workdir, aof=aof)
    server.start()
    return server


def _aof_server(workdir: Path) -> RedisServer:
    require("redis-server", "redis-server")
    return RedisServer(workdir, aof=True)


redis_server = server_fixture(
    "redis_server", _aof_server,
    doc="A redis-server of the test's own, with an AOF (restartable in place).")
