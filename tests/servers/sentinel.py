"""Redis Sentinel: :class:`RedisSentinelServers`, a primary and its replica watched by
three sentinels (``redis-server --sentinel``), that tests can SIGKILL the primary of and
wait for the sentinels to promote the replica. ``redis_sentinel`` is shared by a module's
tests (isolate by key prefix, no kills); ``fresh_redis_sentinel`` is a test's own."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.servers.process import distinct_free_ports, require, server_fixture, wait_answering
from tests.servers.redis import REDIS_ERRORS, Address, RedisProcess

SENTINEL_SERVICE = "conveyor-test"

DATA_NODE_OPTIONS = ("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                     "--repl-ping-replica-period", "1")

INFO_FRESH_MS = 1000
"""A replica a sentinel read INFO from longer ago than this is not ready: it promotes only
replicas whose INFO is fresher than 3 info periods (1.5 s here)."""

SENTINEL_DEBUG = ("info-period", "500", "publish-period", "500", "ask-period", "500",
                  "ping-period", "200")
"""``SENTINEL DEBUG`` timings (Redis 7): by default a sentinel reads a node's INFO every
10 s and waits 4 publish periods (8 s) before it turns a primary that comes back after a
failover into a replica; these make the whole dance take a few seconds."""


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

    def __init__(self, workdir: Path, *, killable: bool = True, password: str | None = None,
                 sentinel_password: str | None = None) -> None:
        ports = distinct_free_ports(5)
        primary, replica = ports[:2]
        auth = ("--requirepass", password, "--masterauth", password) if password else ()
        self.data = [
            RedisProcess(port, workdir / f"data-{port}", *DATA_NODE_OPTIONS, *auth,
                         *(("--replicaof", "127.0.0.1", str(primary)) if port == replica else ()),
                         password=password)
            for port in (primary, replica)
        ]
        self.sentinels = [
            RedisProcess(port, workdir / f"sentinel-{port}", "--sentinel",
                         config_file=workdir / f"sentinel-{port}" / "sentinel.conf",
                         password=sentinel_password)
            for port in ports[2:]
        ]
        self.password = password
        """The data nodes' ``requirepass`` (and ``masterauth``, ``sentinel auth-pass``)."""
        self.sentinel_password = sentinel_password
        """The sentinels' ``requirepass`` (and ``sentinel sentinel-pass``, so that they
        still reach one another)."""
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
                admin = sentinel.admin()
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
                + (f"sentinel auth-pass {SENTINEL_SERVICE} {self.password}\n"
                   if self.password else "")
                + (f"requirepass {self.sentinel_password}\n"
                   f"sentinel sentinel-pass {self.sentinel_password}\n"
                   if self.sentinel_password else "")
            )
            sentinel.start()
        self._wait(self._all_answer, timeout_s, "every node and sentinel to accept connections")
        for sentinel in self.sentinels:
            admin = sentinel.admin()
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
                admin = sentinel.admin()
                host, port = admin.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                views.add((str(host), int(port)))
            if len(views) != 1 or views == {("127.0.0.1", killed_port)}:
                return False
            [(_, port)] = views
            admin = self.node(port).admin()
            return bool(admin.info("replication")["role"] == "master")

        self._wait(promoted, timeout_s, f"the sentinels to promote a replica of {killed_port}")
        return time.monotonic() - self._killed_at[killed_port]

    def wait_replica_rejoined(self, port: int, timeout_s: float = 20.0) -> None:
        """Wait until node ``port`` replicates the current primary with its link up and a
        write on the primary is confirmed by ``WAIT``."""

        def rejoined() -> bool:
            admin = self.node(port).admin()
            info = admin.info("replication")
            if info["role"] != "slave" or info.get("master_link_status") != "up":
                return False
            primary = self.node(self.primary()[1]).admin()
            pipe = primary.pipeline(transaction=False)
            pipe.set("sentinel-probe", 1)
            pipe.execute_command("WAIT", 1, 200)
            return bool(pipe.execute()[1] >= 1)

        self._wait(rejoined, timeout_s, f"{port} to come back as a replica")

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Connection errors, and a sentinel not yet knowing the service, mean "not yet";
        a failure shows every process's log."""
        everyone = (*self.data, *self.sentinels)
        wait_answering(condition, timeout_s, what,
                       processes=[p for p in everyone if p.alive()],
                       errors=(*REDIS_ERRORS, redis.ResponseError), logs=everyone)

    def _all_answer(self) -> bool:
        for process in (*self.data, *self.sentinels):
            admin = process.admin()
            admin.ping()
        return True

    def _watched(self, primary: Address) -> bool:
        for sentinel in self.sentinels:
            admin = sentinel.admin()
            state = admin.sentinel_master(SENTINEL_SERVICE)
            if ((state["ip"], int(state["port"])) != primary or state["flags"] != "master"
                    or int(state["num-slaves"]) != 1
                    or int(state["num-other-sentinels"]) != len(self.sentinels) - 1):
                return False
            # The replica as this sentinel sees it must be one it would promote: counted
            # from the primary's INFO, it was not yet (no INFO of its own read, or too
            # long ago: a SENTINEL FAILOVER then failed with NOGOODSLAVE, once in CI).
            replicas = admin.sentinel_slaves(SENTINEL_SERVICE)
            if len(replicas) != 1:
                return False
            replica = replicas[0]
            if (not replica["is_slave"] or replica["is_disconnected"] or replica["is_sdown"]
                    or replica["master-link-status"] != "ok"
                    or int(replica["info-refresh"]) > INFO_FRESH_MS):
                return False
        admin = self.data[1].admin()
        return bool(admin.info("replication")["master_link_status"] == "up")


def shared_sentinel(workdir: Path) -> RedisSentinelServers:
    require("redis-server (Redis Sentinel)", "redis-server")
    return RedisSentinelServers(workdir, killable=False)


def own_sentinel(workdir: Path) -> RedisSentinelServers:
    require("redis-server (Redis Sentinel)", "redis-server")
    return RedisSentinelServers(workdir)


redis_sentinel = server_fixture(
    "redis_sentinel", shared_sentinel, scope="module",
    doc="""Sentinels shared by a module's tests: they isolate themselves by key prefix and
    may not kill nodes (use ``fresh_redis_sentinel`` for that).""")

DATA_PASSWORD = "data-node-secret"
SENTINEL_PASSWORD = "sentinel-secret"


def passworded_sentinel(workdir: Path) -> RedisSentinelServers:
    require("redis-server (Redis Sentinel)", "redis-server")
    return RedisSentinelServers(workdir, killable=False, password=DATA_PASSWORD,
                                sentinel_password=SENTINEL_PASSWORD)


redis_sentinel_with_passwords = server_fixture(
    "redis_sentinel_with_passwords", passworded_sentinel, scope="module",
    doc=f"""Sentinels shared by a module's tests, as ``redis_sentinel``, whose data nodes
    require {DATA_PASSWORD!r} (``requirepass``; the sentinels' ``auth-pass``) and whose
    sentinels require {SENTINEL_PASSWORD!r}.""")

fresh_redis_sentinel = server_fixture(
    "fresh_redis_sentinel", own_sentinel,
    doc="Sentinels and nodes of the test's own, which it may kill nodes of.")
