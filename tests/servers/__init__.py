"""The real servers tests run against, started on free ports; shared by tests/contract/
and tests/integration/ (fixtures registered by tests/conftest.py's ``pytest_plugins``).

One module per server kind, each built on :mod:`tests.servers.process` (a process on
free ports, a wait with a deadline until it answers, its stop, the one fixture factory):

* :mod:`~tests.servers.redis`: :class:`RedisServer` / ``redis_server``, a
  ``redis-server`` per test that can be restarted in place (AOF kept).
* :mod:`~tests.servers.tansu`: :class:`Tansu` / ``tansu``, a Kafka-protocol broker per
  test module (isolate by topic and group names).
* :mod:`~tests.servers.cluster`: :class:`RedisClusterServers` / ``redis_cluster``
  (a module's, no kills) and ``fresh_redis_cluster`` (a test's own): 3 primaries and
  3 replicas that tests can SIGKILL nodes of and wait for the failover.
* :mod:`~tests.servers.sentinel`: :class:`RedisSentinelServers` / ``redis_sentinel``
  and ``fresh_redis_sentinel``: a primary, its replica and three sentinels;
  ``redis_sentinel_with_passwords``: the same, the data nodes and sentinels each with a
  password of their own.

A missing binary skips locally and fails under ``CONVEYOR_REQUIRE_SERVERS=1``.
"""

from tests.servers.cluster import (
    RedisClusterServers,
    SlotRange,
    fresh_redis_cluster,
    redis_cluster,
)
from tests.servers.process import distinct_free_ports, server_fixture
from tests.servers.redis import Address, RedisProcess, RedisServer, redis_server, start_redis
from tests.servers.sentinel import (
    SENTINEL_SERVICE,
    RedisSentinelServers,
    fresh_redis_sentinel,
    redis_sentinel,
    redis_sentinel_with_passwords,
)
from tests.servers.tansu import Tansu, require_tansu, start_tansu, tansu, tansu_binary

__all__ = [
    "SENTINEL_SERVICE", "Address", "RedisClusterServers", "RedisProcess",
    "RedisSentinelServers", "RedisServer", "SlotRange", "Tansu", "distinct_free_ports",
    "fresh_redis_cluster", "fresh_redis_sentinel", "redis_cluster", "redis_sentinel",
    "redis_sentinel_with_passwords", "redis_server", "require_tansu", "server_fixture",
    "start_redis", "start_tansu", "tansu", "tansu_binary",
]
