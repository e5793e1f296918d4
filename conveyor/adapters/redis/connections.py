"""Clients for ``[redis]``: one server, a cluster or a primary found by Sentinel, their
commands packed by hiredis, their deadlines tolerant of a blocked event loop; the
helpers that run a command on the right node of a cluster (:func:`on_primary`,
:func:`mget`, :func:`run_replicated`).

redis-py's own retries are off: :class:`~conveyor.adapters.redis.errors.Caller` decides
what may be retried.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import hiredis
import redis.asyncio as aioredis
import redis.asyncio.connection as rconn
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff

from conveyor.adapters.redis.errors import (
    CLUSTER_ERRORS,
    ClusterUnreachableError,
    NotAClusterError,
    SentinelCredentialsRefused,
)
from conveyor.adapters.redis.urls import check_url, redact_url, sentinel_addresses
from conveyor.platform.config import RedisConfig
from conveyor.platform.deadlines import StallTolerantTimeout
from conveyor.platform.errors import ConfigError, ConveyorError

log = logging.getLogger("conveyor.redis")

T = TypeVar("T")


def _credential(env_name: str) -> str | None:
    return os.environ.get(env_name) or None if env_name else None


class _CPacking:
    """Commands packed by hiredis' C packer, not redis-py's Python one (asyncio); reads,
    writes and connects bounded by a :class:`StallTolerantTimeout`.

    redis-py packs each argument in Python, re-joining a growing buffer: a publish
    passes seven arguments per message, and that packing cost ~4.5 us a message against
    ~0.7 here (measured on 62-entry calls). The wire bytes are the same.

    redis-py bounds a read by ``socket_timeout`` and a connect by
    ``socket_connect_timeout`` with ``asyncio.timeout``: a handler that blocked the
    loop past the deadline made every call in flight fail as the loop resumed, their
    replies waiting unread, and each connection was dropped and opened again ("redis
    unreachable", "ack failed; retrying"). Here the same deadlines are put off while the
    loop is blocked (tests/integration/redis/test_redis_stall_deadlines.py).
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]  # a command name with literal arguments: 'CONFIG GET'
        if isinstance(first, str):
            first = first.encode()
        if isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        return [cast(bytes, hiredis.pack_command(args))]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """redis-py's, its write bounded by ``asyncio.timeout`` instead of
        ``asyncio.wait_for`` (Python 3.11 only; 3.12's ``wait_for`` is built on it).

        On 3.11 ``wait_for`` swallows a cancellation that arrives as the write finishes:
        the cancelled call then went on to wait for its reply. A stopping worker waited
        out each queue's blocking ``XREADGROUP`` (``poll_timeout_ms``), and a loop
        stopped by cancellation alone (the balancer's lease renewal) did not stop at all
        (tests/integration/redis/test_redis_stop_idle.py). redis-py reads the connection's
        ``socket_timeout`` to pick ``wait_for``: it is unset for the call, and applied
        around it here instead.
        """
        conn: Any = self
        send = super().send_packed_command  # type: ignore[misc]
        timeout_s = conn.socket_timeout
        if not timeout_s or sys.version_info >= (3, 12):
            await send(command, check_health)
            return
        conn.socket_timeout = None
        try:
            async with StallTolerantTimeout(timeout_s):
                await send(command, check_health)
        except TimeoutError:  # asyncio's: redis-py's own TimeoutError is no subclass
            await conn.disconnect(nowait=True)
            raise rex.TimeoutError("Timeout writing to socket") from None
        finally:
            conn.socket_timeout = timeout_s

    async def read_response(self, disable_decoding: bool = False,
                            timeout: float | None = None, *,  # noqa: ASYNC109
                            disconnect_on_error: float | None = True,  # as Sentinel's
                            push_request: bool | None = False) -> Any:
        """redis-py's, its ``socket_timeout`` applied here, tolerant of a stall (an
        explicit ``timeout`` is redis-py's to apply). redis-py disconnects on the
        cancellation as it does on its own timeout. (redis-py would let RESP3
        maintenance notices relax a read in flight; Conveyor's connections are RESP2.)"""
        conn: Any = self
        read = super().read_response  # type: ignore[misc]
        timeout_s = conn.socket_timeout
        if timeout is not None or not timeout_s:
            return await read(disable_decoding, timeout,
                              disconnect_on_error=disconnect_on_error,
                              push_request=push_request)
        try:
            async with StallTolerantTimeout(timeout_s):
                return await read(disable_decoding, math.inf,
                                  disconnect_on_error=disconnect_on_error,
                                  push_request=push_request)
        except TimeoutError:  # asyncio's (the read disconnected on its cancellation)
            raise rex.TimeoutError(f"Timeout reading from {conn._host_error()}") from None

    async def _connect(self) -> None:
        """redis-py's, bounded by ``socket_connect_timeout`` tolerant of a stall
        (redis-py turns the ``TimeoutError`` into its own). The attribute is blank
        meanwhile and put back however the connect ends; what else reads it (a
        ``disconnect``, which returns early on a connection not yet open; RESP3's
        maintenance notices, which Conveyor's RESP2 connections never get) does not
        run during it."""
        conn: Any = self
        connect = super()._connect  # type: ignore[misc]
        timeout_s = conn.socket_connect_timeout
        if not timeout_s:
            await connect()
            return
        conn.socket_connect_timeout = None
        try:
            async with StallTolerantTimeout(timeout_s):
                await connect()
        finally:
            conn.socket_connect_timeout = timeout_s


class _CPackedConnection(_CPacking, rconn.Connection):
    pass


class _CPackedSSLConnection(_CPacking, rconn.SSLConnection):
    pass


class _CPackedSentinelConnection(_CPacking, SentinelManagedConnection):
    pass


class _CPackedSentinelSSLConnection(_CPacking, SentinelManagedSSLConnection):
    pass


_C_PACKED: dict[type[Any], type[Any]] = {
    rconn.Connection: _CPackedConnection, rconn.SSLConnection: _CPackedSSLConnection,
    SentinelManagedConnection: _CPackedSentinelConnection,
    SentinelManagedSSLConnection: _CPackedSentinelSSLConnection,
}


class ClusterClient(RedisCluster):
    """redis-py's asyncio cluster client (slot routing, ``MOVED``/``ASK``, topology
    refreshes), plus a plain client per primary for the calls that must share one
    connection: a publish's pipelined chunks and the ``WAIT`` after them (``WAIT`` counts
    the replicas of *this connection's* writes). :func:`on_primary` runs such calls.

    Two of redis-py's habits are changed, both found by a daemon starting 400 queues at
    once (tests/integration/redis/test_redis_cluster.py):

    * a command issued before the slot map was first read is routed by redis-py as if it
      had no key (to a random primary: ``MOVED``); here every command waits for the map;
    * every fifth ``MOVED`` made redis-py close *all* its connections and re-read the
      map, failing the calls in flight on them ("Connection closed by server", or an
      ``AttributeError`` from a connection closed while it was opening). Here a
      ``MOVED`` patches the map for its slot (``reinitialize_steps=0``); the whole map is
      re-read after a connection error, as before.
    """

    def __init__(self, *args: Any, node_kwargs: dict[str, Any], **kwargs: Any) -> None:
        kwargs.setdefault("reinitialize_steps", 0)
        super().__init__(*args, **kwargs)
        self._node_kwargs = node_kwargs
        self._node_clients: dict[str, aioredis.Redis] = {}

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        """redis-py's reading of the slots, its failures made ones Conveyor knows.

        When no node answers, redis-py raises a ``RedisClusterException`` ("Redis Cluster
        cannot be connected"), which is no ``RedisError``: neither retried nor worded, it
        ended every command in a traceback and a daemon at once. Here it is a
        :class:`ClusterUnreachableError`, a ``ConnectionError`` (retried, reported as any
        unreachable server), or the credentials' refusal that made it; a server not in
        cluster mode is named (a :class:`NotAClusterError`: the config's mistake). Every path to a
        command reads the slots here first (``exists`` of one key too, which redis-py
        splits by slot).
        """
        try:
            return await super().initialize(*args, **kwargs)
        except rex.RedisClusterException as exc:
            cause = exc.__cause__
            if isinstance(cause, (rex.AuthenticationError, rex.AuthorizationError)):
                raise cause from None
            nodes = ", ".join(self.nodes_manager.startup_nodes) or "none"
            if isinstance(cause, (rex.ConnectionError, rex.TimeoutError, OSError)):
                raise ClusterUnreachableError(
                    f"no node of the cluster answered (tried {nodes}): {cause}") from exc
            if isinstance(cause, rex.RedisClusterException):  # a server not in cluster mode
                raise NotAClusterError(f"{nodes}: {cause}") from exc
            raise

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:  # routed by the map, never by a guess made without it
            await self.initialize()
        return await super().execute_command(*args, **kwargs)

    async def primary_for(self, key: str) -> aioredis.Redis:
        """A plain client of the primary now serving ``key``'s slot."""
        if self._initialize:
            await self.initialize()
        node = self.get_node_from_key(key)
        if node is None:  # pragma: no cover - get_node_from_key raises instead
            raise rex.SlotNotCoveredError(f"no node serves {key!r}")
        return self._node_client(node.name, node.host, int(node.port))

    async def primary_clients(self) -> dict[str, aioredis.Redis]:
        """A plain client of every primary, by ``host:port``."""
        if self._initialize:
            await self.initialize()
        return {node.name: self._node_client(node.name, node.host, int(node.port))
                for node in self.get_primaries()}

    def _node_client(self, name: str, host: str, port: int) -> aioredis.Redis:
        client = self._node_clients.get(name)
        if client is None:
            client = aioredis.Redis(host=host, port=port, **self._node_kwargs)
            _c_packed(client)
            self._node_clients[name] = client
        return client

    def topology_changed(self) -> None:
        """Re-read the slots before the next call (a node failed or a slot moved)."""
        self._initialize = True

    async def close_all(self) -> None:
        for client in self._node_clients.values():
            await client.aclose()
        self._node_clients.clear()
        await self.aclose()


def _node_address(client: aioredis.Redis) -> str:
    """``HOST:PORT`` (``[IPV6]:PORT``) of a client's server: no credentials."""
    kwargs = client.connection_pool.connection_kwargs
    host = str(kwargs.get("host", "?"))
    return f"[{host}]:{kwargs.get('port')}" if ":" in host else f"{host}:{kwargs.get('port')}"


class _Sentinels(Sentinel):
    """redis-py's Sentinel, its "no primary" error worded.

    redis-py (8.x) names each sentinel that failed by its client's whole repr, every
    connection option (~1,000 characters a sentinel), and Conveyor printed it twice: in
    the outage's warning and in the error. The search here is redis-py's (each sentinel
    in turn; the one that answers is asked first next time; ``force_master_ip``, which
    Conveyor does not set, aside), and its ``MasterNotFoundError`` (a
    ``ConnectionError``: retried as an outage) names each sentinel by address and why
    it named no primary.

    When the sentinels that answered all refused the credentials (and the rest did not
    answer), no retry helps: that is a :class:`SentinelCredentialsRefused`, a config
    error on the sentinels' password, not "no primary" retried for ``retry_max_s``.

    When no sentinel answers at all (all restarted together, or cut off from this
    host), nothing can have failed over since the last answer, so a new connection goes
    to the primary they last named, as the connections already open do: otherwise a
    primary that drops its clients' connections meanwhile (a proxy restarted, its
    ``timeout``) stalls every daemon though it answers. A sentinel that answers but
    names no primary (a failover under way) is believed. Said once per outage of the
    sentinels, and once when one answers again.
    """

    credentials = ""
    """What was sent to the sentinels, for that error (never the password itself)."""
    _last: tuple[str, int] | None = None
    """The primary the sentinels last named."""
    _unanswered = False
    """No sentinel answered the last search (and the last primary was used)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        reasons: list[str] = []
        refused: dict[str, list[str]] = {}  # why: addresses
        answered = False  # a sentinel that did not refuse the credentials
        for i, node in enumerate(self.sentinels):
            address = _node_address(node)
            try:
                masters = cast(dict[str, Any], await node.sentinel_masters())  # RESP2
            except rex.AuthenticationError as exc:
                text = str(exc).rstrip(".") or type(exc).__name__
                refused.setdefault(text, []).append(address)
                reasons.append(f"{address}: {text}")
                continue
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                text = str(exc).rstrip(".") or type(exc).__name__
                reasons.append(text if address in text else f"{address}: {text}")
                continue
            answered = True
            if self._unanswered:
                self._unanswered = False
                log.warning("sentinel %s answers again", address)
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[i] = node, self.sentinels[0]
                self._last = state["ip"], int(state["port"])
                return self._last
            reasons.append(f"{address}: " + ("its primary is down or not agreed on" if state
                                             else "monitors no such service"))
        if refused and not answered:
            said = "; ".join(f"{', '.join(addresses)}: {text}"
                             for text, addresses in refused.items())
            raise SentinelCredentialsRefused(f"{said}; {self.credentials}")
        if not answered and not refused and self._last is not None:
            if not self._unanswered:
                self._unanswered = True
                host, port = self._last
                log.warning("no sentinel answers for %r (%s): connecting to the primary "
                            "they last named, %s:%d, until one does", service_name,
                            "; ".join(reasons), host, port)
            return self._last
        raise MasterNotFoundError(
            f"the sentinels named no primary for {service_name!r} ({'; '.join(reasons)})")


class SentinelClient(aioredis.Redis):
    """A client of the primary the sentinels name for ``[redis] sentinel_service``
    (``mode = "sentinel"``); for the rest a standalone client, keys laid out alike.

    Its pool (redis-py's ``SentinelConnectionPool``) asks the sentinels for the primary
    on every new connection, and drops its idle connections when the answer changes. A
    connection open to a primary that was demoted gets ``READONLY`` on its next write,
    which redis-py turns into a ``ConnectionError`` after closing it; a killed primary
    breaks its connections outright. Either way :class:`Caller` retries as in any
    outage, and the retry connects anew, to the promoted replica. While the sentinels
    agree on no primary (the failover itself), connecting raises ``MasterNotFoundError``,
    a ``ConnectionError`` too. Closing it closes its connections to the sentinels.
    """

    sentinel_manager: Sentinel | None = None
    """The sentinels' clients (``sentinel`` would hide redis-py's SENTINEL command)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            await self.sentinel_manager.aclose()


Client = aioredis.Redis | ClusterClient
"""What :func:`connect` returns: a standalone client (a :class:`SentinelClient` with
``mode = "sentinel"``), or a cluster one."""


def _c_packed(client: aioredis.Redis) -> None:
    pool = client.connection_pool  # connections open lazily: none exists yet
    pool.connection_class = _C_PACKED.get(pool.connection_class, pool.connection_class)


NO_POOL_CAP = 2**31
"""The connections a client's pool may open (to each node, on a cluster): no cap in
practice, unless the URL sets ``max_connections``. redis-py caps a pool at 100 when told
nothing (a cluster node's in every version, one server's in 8.x: 5.x did not) and then
fails each call past them at once with ``Too many connections``, which reads as a server
out of reach: a daemon holds one connection per queue it reads (a blocking
``XREADGROUP``), and a client that does not gather its calls one per ``publish`` in
flight. Past 100, pulls failed and were retried every ``poll_timeout_ms``, and a daemon
reading 160 queues stalled."""


def connect(cfg: RedisConfig) -> Any:
    """A client for ``[redis]`` of the config (connections are opened lazily): an
    ``aioredis.Redis``, or a :class:`ClusterClient` with ``mode = "cluster"``.

    redis-py's own retries are disabled: a blind retry of ``XREADGROUP`` could strand
    entries in the pending list; :class:`Caller` decides what may be retried.
    """
    url = cfg.url
    mode = cfg.mode
    cluster = mode == "cluster"
    check_url(url, cluster=cluster)
    scheme = urlsplit(url).scheme
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": cfg.connect_timeout_s,
        "socket_timeout": cfg.socket_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
    }
    user, password = _credential(cfg.username_env), _credential(cfg.password_env)
    if user is not None:
        kwargs["username"] = user
    if password is not None:
        kwargs["password"] = password
    if scheme == "rediss":
        check_tls_files(cfg)
        kwargs["ssl_cert_reqs"] = ssl.CERT_REQUIRED if cfg.tls_verify else ssl.CERT_NONE
        kwargs["ssl_check_hostname"] = bool(cfg.tls_verify)
        for key, value in (
            ("ssl_ca_certs", cfg.tls_ca_file),
            ("ssl_certfile", cfg.tls_cert_file),
            ("ssl_keyfile", cfg.tls_key_file),
        ):
            if value:
                kwargs[key] = value
    try:
        if cluster:
            return _connect_cluster(url, kwargs)
        if mode == "sentinel":
            return _connect_sentinel(cfg, url, kwargs)
        client = aioredis.Redis.from_url(url, retry_on_timeout=False,
                                         max_connections=NO_POOL_CAP, **kwargs)
    except ValueError as exc:  # redis-py quotes the URL: do not repeat it
        raise ConfigError(f"$.redis.url {redact_url(url)}: {type(exc).__name__}") from None
    _c_packed(client)
    return client


class _KeyEncrypted(ConveyorError):
    """The client key asked for a password (Conveyor passes none)."""


def _no_password() -> bytes:
    raise _KeyEncrypted


def check_tls_files(cfg: RedisConfig) -> None:
    """Refuse a TLS file of ``[redis]`` that cannot be used, naming its field
    (:class:`ConfigError`): redis-py reads them only as it opens a connection, and its
    error ("Error 2 connecting to …") reads as a server out of reach, retried for
    ``retry_max_s``. Each is loaded into a throwaway context as redis-py loads it."""
    files = {"tls_ca_file": cfg.tls_ca_file, "tls_cert_file": cfg.tls_cert_file,
             "tls_key_file": cfg.tls_key_file}
    for field, path in files.items():
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"$.redis.{field}: cannot read {path!r} "
                                  f"({exc.strerror or type(exc).__name__})") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cfg.tls_ca_file:
        try:
            context.load_verify_locations(cafile=cfg.tls_ca_file)
        except ssl.SSLError:
            raise ConfigError(f"$.redis.tls_ca_file: {cfg.tls_ca_file!r} holds no "
                              "certificate in PEM form") from None
    if cfg.tls_cert_file:
        key_field = "tls_key_file" if cfg.tls_key_file else "tls_cert_file"
        try:
            context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file or None,
                                    password=_no_password)
        except _KeyEncrypted:
            raise ConfigError(
                f"$.redis.{key_field}: the client key in {files[key_field]!r} is encrypted, "
                "and Conveyor passes no password for it; give it unencrypted") from None
        except ssl.SSLError:
            raise ConfigError(
                f"$.redis.tls_cert_file: cannot load the client certificate "
                f"{cfg.tls_cert_file!r} with its key in {files[key_field]!r} (not PEM, or "
                "the key is not the certificate's)") from None


def _connect_cluster(url: str, kwargs: dict[str, Any]) -> ClusterClient:
    # As redis-py's from_url does for one server: the URL's options win.
    options = {**kwargs, **rconn.parse_url(url)}
    options.pop("db", None)
    if options.pop("connection_class", None) is rconn.SSLConnection:
        options["ssl"] = True
    node_kwargs = {k: v for k, v in options.items() if k not in ("host", "port")}
    options.setdefault("max_connections", NO_POOL_CAP)  # the URL's, if it says
    client = ClusterClient(**options, node_kwargs=node_kwargs)
    # The cluster's node connections pack with hiredis too (ClusterNode reads the class
    # from these keyword arguments when the topology is first read).
    conn_kwargs = client.nodes_manager.connection_kwargs
    packed = _C_PACKED.get(conn_kwargs["connection_class"], conn_kwargs["connection_class"])
    conn_kwargs["connection_class"] = packed
    # The start-up nodes were built already, and redis-py keeps reading the slots through
    # them: their (not yet opened) connections are of the same kind.
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = packed
    return client


def _sent(what: str, field: str, env_field: str, value: str | None) -> str:
    """What went to the sentinels as ``what``, from the variable ``field`` (whose value
    is ``env_field``) names, said without the value: ``the password in SENTINEL_PW
    (sentinel_password_env) was sent``, or why none was."""
    if not env_field:
        return f"no {what} was sent: {field} is empty"
    if value is None:
        return f"no {what} was sent: {env_field} ({field}) is unset or empty"
    return f"the {what} in {env_field} ({field}) was sent"


def _connect_sentinel(cfg: RedisConfig, url: str, kwargs: dict[str, Any]) -> SentinelClient:
    # The URL's options win, as in from_url; its host and port are the sentinels' to say.
    options = {**kwargs, **rconn.parse_url(url)}
    options.pop("host", None)
    options.pop("port", None)
    tls = options.pop("connection_class", None) is rconn.SSLConnection
    options["connection_class"] = _C_PACKED[SentinelManagedSSLConnection if tls
                                            else SentinelManagedConnection]
    options.setdefault("max_connections", NO_POOL_CAP)  # the URL's, if it says
    # The sentinels: same timeouts and TLS as the data nodes, credentials of their own.
    sentinel_kwargs: dict[str, Any] = {
        key: value for key, value in kwargs.items()
        if key.startswith(("socket_", "ssl_")) or key == "retry"
    }
    if tls:
        sentinel_kwargs["ssl"] = True
    user = _credential(cfg.sentinel_username_env)
    password = _credential(cfg.sentinel_password_env)
    if user is not None:
        sentinel_kwargs["username"] = user
    if password is not None:
        sentinel_kwargs["password"] = password
    sentinel = _Sentinels(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        sentinel_addresses(cfg.sentinels), sentinel_kwargs=sentinel_kwargs, **options)
    sentinel.credentials = _sent("password", "sentinel_password_env",
                                 cfg.sentinel_password_env, password)
    if cfg.sentinel_username_env:
        sentinel.credentials += ", " + _sent("user", "sentinel_username_env",
                                             cfg.sentinel_username_env, user)
    client = cast(SentinelClient, sentinel.master_for(cfg.sentinel_service,
                                                      redis_class=SentinelClient))
    client.sentinel_manager = sentinel
    return client


async def on_primary(redis: Any, key: str, fn: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    """``fn`` with a client whose commands all go over the connection(s) of the node
    serving ``key``: the client itself on a standalone server, the slot's primary on a
    cluster — where a failure (a node down, a slot moved) makes the next call re-read
    the slots, and is retried like any connection error by :class:`Caller`."""
    if not isinstance(redis, ClusterClient):
        return await fn(redis)
    node = await redis.primary_for(key)
    try:
        return await fn(node)
    except (rex.ConnectionError, rex.TimeoutError, OSError, *CLUSTER_ERRORS):
        redis.topology_changed()
        raise


async def mget(redis: Any, keys: Sequence[str]) -> list[Any]:
    """``MGET``; on a cluster, one per slot (``keys`` may hash anywhere)."""
    if isinstance(redis, ClusterClient):
        return list(await redis.mget_nonatomic(list(keys)))
    return list(await redis.mget(keys))


async def key_types(redis: Any, keys: Sequence[str]) -> list[str]:
    """``TYPE`` of each of ``keys`` (``none`` where absent), in one pipeline (on a
    cluster, split by node: ``keys`` may hash anywhere)."""
    if not keys:
        return []
    pipe: Any
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.type(key)
        replies = await pipe.execute()
    return [r.decode() if isinstance(r, bytes) else str(r) for r in replies]


async def close(redis: Any) -> None:
    """Close a client from :func:`connect`, with its per-node clients on a cluster."""
    if isinstance(redis, ClusterClient):
        await redis.close_all()
    else:
        await redis.aclose()


async def run_replicated(redis: Any, script: Any, keys: Sequence[str],
                         args: Sequence[Any], replicas: int, timeout_ms: int) -> tuple[Any, int]:
    """``script``'s reply and how many replicas confirmed the write (``[redis]
    min_replicas``): one pipeline of the script and ``WAIT``, so both run on one
    connection, as ``WAIT`` requires. With ``replicas`` 0, the script alone (and 0)."""
    if not replicas:
        return await script(keys=keys, args=args), 0

    async def send(client: aioredis.Redis) -> tuple[Any, int]:
        pipe: Any
        async with client.pipeline(transaction=False) as pipe:  # released if loading fails
            pipe.scripts.add(script)  # loaded first should the server not know it
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            reply, confirmed = await pipe.execute()
        return reply, int(confirmed)

    return await on_primary(redis, keys[0], send)
