"""A local Redis Cluster: :class:`RedisClusterServers`, six ``redis-server`` nodes joined
into three primaries with a replica each, that tests can SIGKILL nodes of and wait for
the failover. ``redis_cluster`` is shared by a module's tests (isolate by key prefix, no
kills); ``fresh_redis_cluster`` is a test's own, for the tests that kill nodes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from tests.servers.process import distinct_free_ports, require, server_fixture, wait_answering
from tests.servers.redis import REDIS_ERRORS, Address, RedisProcess

# A Redis Cluster: six redis-servers, three primaries with a replica each.

CLUSTER_SLOTS = 16384
PRIMARIES = 3
PRIMARY_SLOTS = ((0, 5460), (5461, 10922), (10923, 16383))
"""The slots of each primary: the three even ranges redis-cli --cluster create makes
(tests/unit/test_redis_cluster_keys.py counts queues per range)."""

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


def cluster_node(port: int, bus_port: int, workdir: Path) -> RedisProcess:
    """One node of a :class:`RedisClusterServers`; its cluster bus on ``bus_port``, chosen
    free too, since ``port + 10000`` may be taken or > 65535."""
    return RedisProcess(port, workdir, "--cluster-port", str(bus_port), *CLUSTER_NODE_OPTIONS)


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
    ``redis-server``, 7.0+) on free ports, each in its own directory, joined by CLUSTER
    commands into three primaries with one replica each (:meth:`_join`: the slots,
    config epochs and pairs ``redis-cli --cluster create --cluster-replicas 1`` gives,
    without the second it sleeps). :meth:`start` returns once every node reports
    ``cluster_state:ok`` with all 16384 slots served, every node names the same
    primaries and replicas, and every replica's link to its primary is up: about 2.05 s,
    Redis's floor. The join and the replicas' sync take ~0.25 s and the replicas show in
    CLUSTER SLOTS by ~1.2-1.7 s, but a primary holds ``cluster_state:ok`` back until 2 s
    after it starts (``CLUSTER_WRITABLE_DELAY``, fixed in the server).

    :meth:`kill` SIGKILLs a node; :meth:`wait_failover` then waits for its replica to
    take its slots (node timeout 1 s: typically 2-3 s). The topology is always read from
    the nodes (CLUSTER SLOTS), so it stays right after a failover.
    """

    size = 6

    def __init__(self, workdir: Path, *, killable: bool = True) -> None:
        ports = distinct_free_ports(2 * self.size)
        self.bus_ports = ports[1::2]
        """Each node's cluster bus port, in the order of :attr:`nodes`."""
        self.nodes = [cluster_node(ports[2 * i], self.bus_ports[i], workdir / f"node-{i}")
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

    def node(self, port: int) -> RedisProcess:
        [node] = [n for n in self.nodes if n.port == port]
        return node

    def live_nodes(self) -> list[RedisProcess]:
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
        self._join(timeout_s)
        self._wait(self._ready, timeout_s, "the cluster to be ok with every replica in sync")
        self.startup_s = time.monotonic() - began

    def _join(self, timeout_s: float) -> None:
        """What ``redis-cli --cluster create --cluster-replicas 1`` does, without the 1 s
        (or more) it sleeps waiting for the join: config epochs 1-6, the slots in three
        even ranges on the first three nodes, every node met, then node ``i + 3`` a
        replica of node ``i``. Every pair meets directly: met through one node, the others
        learn of each other by gossip, 0.5-1.5 s instead of ~0.2 s."""
        primaries, replicas = self.nodes[:PRIMARIES], self.nodes[PRIMARIES:]
        for epoch, node in enumerate(self.nodes, start=1):
            node.admin().execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        for node, (first, last) in zip(primaries, PRIMARY_SLOTS, strict=True):
            node.admin().execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        for i, node in enumerate(self.nodes):
            for other, bus_port in zip(self.nodes[i + 1:], self.bus_ports[i + 1:], strict=True):
                node.admin().execute_command("CLUSTER MEET", "127.0.0.1", other.port, bus_port)
        ids = [node.admin().execute_command("CLUSTER MYID") for node in self.nodes]
        self._wait(lambda: self._all_know(ids), timeout_s, "every cluster node to know all six")
        for replica, primary_id in zip(replicas, ids[:PRIMARIES], strict=True):
            replica.admin().execute_command("CLUSTER REPLICATE", primary_id)

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
        """Connection errors mean "not yet"; a failure shows every node's log."""
        wait_answering(condition, timeout_s, what, processes=self.live_nodes(),
                       errors=REDIS_ERRORS, logs=self.nodes)

    def _all_answer(self) -> bool:
        return all(node.admin().ping() for node in self.nodes)

    def _all_know(self, ids: list[str]) -> bool:
        """Every node knows the nodes of ``ids`` by those ids (handshakes done), and no
        other (cluster_known_nodes counts nodes still in a handshake too)."""
        for node in self.nodes:
            admin = node.admin()
            if int(admin.cluster("INFO")["cluster_known_nodes"]) != len(ids):
                return False
            known = admin.execute_command("CLUSTER NODES").values()
            if (sorted(n["node_id"] for n in known) != sorted(ids)
                    or any("handshake" in n["flags"] for n in known)):
                return False
        return True

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


def _address(entry: list[Any]) -> Address:
    """The ``[host, port, id, ...]`` of a CLUSTER SLOTS row."""
    return (str(entry[0]), int(entry[1]))


def shared_cluster(workdir: Path) -> RedisClusterServers:
    require("redis-server (Redis Cluster)", "redis-server")
    return RedisClusterServers(workdir, killable=False)


def own_cluster(workdir: Path) -> RedisClusterServers:
    require("redis-server (Redis Cluster)", "redis-server")
    return RedisClusterServers(workdir)


redis_cluster = server_fixture(
    "redis_cluster", shared_cluster, scope="module",
    doc="""A cluster shared by a module's tests: they isolate themselves by key prefix and
    may not kill nodes (use ``fresh_redis_cluster`` for that).""")

fresh_redis_cluster = server_fixture(
    "fresh_redis_cluster", own_cluster,
    doc="A cluster of the test's own, which it may kill nodes of.")
