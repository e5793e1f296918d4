"""Connecting to Redis: URLs and credentials, key names and entry ids, retries, errors.

Shared by the Redis queue adapter and the Redis membership/lease stores. Nothing here
prints a password: URLs are logged through :func:`redact_url` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit, urlunsplit

import hiredis
import redis.asyncio as aioredis
import redis.asyncio.connection as rconn
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay

from conveyor.platform.backoff import Backoff
from conveyor.platform.config_checks import SENTINEL_PORT
from conveyor.platform.errors import BrokerConnectionError, BrokerError, ConfigError
from conveyor.platform.ids import NAME, SequenceToken
from conveyor.platform.outage import OutageLog

log = logging.getLogger("conveyor.redis")

T = TypeVar("T")



def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log or print).

    Both places redis-py reads a password from are covered: the user-info part
    (``redis://user:pw@host``) and the ``password`` query parameter (``?password=pw``).
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            netloc = f"{parts.username or ''}:***@{host}"
    except ValueError:
        return "<unparseable redis url>"
    query = "&".join(
        f"{field.partition('=')[0]}=***"
        if unquote_plus(field.partition("=")[0]).lower() == "password" else field
        for field in parts.query.split("&")
    ) if parts.query else parts.query
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


URL_OPTIONS = ("db", "username", "password", "client_name", "health_check_interval",
               "socket_keepalive")
"""Query parameters a Redis URL may carry; the others redis-py knows are set in ``[redis]``
(below) or by Conveyor itself, and anything else would fail only when connecting."""
_URL_FIELDS = {
    "socket_timeout": "socket_timeout_s", "timeout": "socket_timeout_s",
    "socket_connect_timeout": "connect_timeout_s", "retry_on_timeout": "retry_max_s",
    "ssl_check_hostname": "tls_verify", "ssl_cert_reqs": "tls_verify",
    "ssl_ca_certs": "tls_ca_file", "ssl_certfile": "tls_cert_file",
    "ssl_keyfile": "tls_key_file",
}


def check_url(url: str, *, cluster: bool = False) -> None:
    """Refuse a URL redis-py would misread or reject only when connecting (ConfigError).

    A cluster has database 0 only: another number is refused with ``cluster``.

    Errors show the URL through :func:`redact_url` and name options, never their values.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError:
        raise ConfigError(
            f"$.redis.url: not a valid URL ({shown}); expected "
            "redis[s]://[USER:PASSWORD@]HOST[:PORT][/DB][?OPTION=VALUE...]"
        ) from None
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"$.redis.url: expected redis:// or rediss://, got {shown}")
    db = unquote(parts.path).strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"$.redis.url: the path is a database number, got {shown}")
    query_db = dict(parse_qsl(parts.query)).get("db", "")
    if cluster and any(d.strip("0") for d in (db, query_db)):
        raise ConfigError(
            f"$.redis.url: a Redis Cluster has database 0 only ($.redis.mode is "
            f"\"cluster\"), got {shown}"
        )
    for option, _ in parse_qsl(parts.query, keep_blank_values=True):
        if option in _URL_FIELDS:
            raise ConfigError(
                f"$.redis.url: set {option!r} as [redis] {_URL_FIELDS[option]}, "
                f"not in the URL ({shown})"
            )
        if option not in URL_OPTIONS:
            raise ConfigError(
                f"$.redis.url: unknown option {option!r} in {shown} "
                f"(accepted: {', '.join(URL_OPTIONS)})"
            )
    try:
        rconn.parse_url(url)
    except ValueError as exc:  # "Invalid value for 'db' in connection URL." (no value)
        raise ConfigError(f"$.redis.url: {exc} ({shown})") from None


def server_name(cfg: Any) -> str:
    """Where ``[redis]`` points, safe to log: the URL (redacted), or with ``mode =
    "sentinel"`` the service and the sentinels asked for it."""
    if getattr(cfg, "mode", "standalone") == "sentinel":
        return f"{cfg.sentinel_service} (sentinels {','.join(cfg.sentinels)})"
    return redact_url(cfg.url)


def check_name(value: str, what: str) -> str:
    """Reject names that could reach into another key space (``:``, ``*``, spaces...)."""
    if not NAME.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} may only contain letters, digits, '_', '.', '-' (1-128 chars)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Keys:
    """Every Redis key Conveyor uses, derived from a validated prefix.

    Streams are per queue and shared by all apps (each app is a consumer group);
    coordination keys are per app. Namespaces and stream keys never appear in key
    names, so message metadata cannot address other keys.

    With ``cluster`` (``[redis] mode = "cluster"``) the keys one script touches together
    share a hash tag, so they share a cluster slot: a queue's lease, fencing counter and
    refused-acks count end in ``{PREFIX:q:N}`` — the stream's own name, which hashes like
    the stream key itself — and an app's three membership keys end in
    ``{PREFIX:app:APP}``. Every other key is used alone. Standalone servers keep the
    original names (a rolling upgrade would otherwise run two lease keys per queue).
    """

    prefix: str
    cluster: bool = False

    def __post_init__(self) -> None:
        check_name(self.prefix, "$.redis.prefix")

    def queue(self, queue: int) -> str:
        return f"{self.prefix}:q:{int(queue)}"

    def _of_queue(self, name: str, queue: int) -> str:
        return f"{name}:{{{self.queue(queue)}}}" if self.cluster else f"{name}:{int(queue)}"

    def _of_app(self, group: str, name: str) -> str:
        app = self.app(group)
        return f"{app}:{name}:{{{app}}}" if self.cluster else f"{app}:{name}"

    def published(self, queue: int, batch_id: str) -> str:
        """The marker of one published batch: the queue's stream name is its hash tag
        (``{...}``), so it shares the stream's cluster slot and one script may touch both;
        stream names themselves stay as they were."""
        return f"{self.prefix}:pub:{{{self.queue(queue)}}}:{batch_id}"

    def replayed(self, group: str, queue: int, letter_id: str) -> str:
        """Cluster only: the marker of a dead letter replayed to ``queue`` (in the queue's
        slot), which makes a replay cut between its two writes safe to run again."""
        app = check_name(group, "app name")
        return f"{self.prefix}:replayed:{{{self.queue(queue)}}}:{app}:{letter_id}"

    def dead_letters(self, group: str) -> str:
        return f"{self.prefix}:dlq:{check_name(group, 'app name')}"

    def letters_stored(self, group: str, batch_id: str) -> str:
        """The marker of one stored batch of dead letters, in the letters' stream's slot
        (its name is the hash tag), as :meth:`published` is in its queue's."""
        return f"{self.prefix}:dlq-batch:{{{self.dead_letters(group)}}}:{batch_id}"

    def app(self, group: str) -> str:
        return f"{self.prefix}:app:{check_name(group, 'app name')}"

    def lease(self, group: str, queue: int) -> str:
        return self._of_queue(f"{self.app(group)}:lease", queue)

    def fence(self, group: str, queue: int) -> str:
        return self._of_queue(f"{self.app(group)}:fence", queue)

    def leases_generation(self, group: str) -> str:
        return f"{self.app(group)}:leases-generation"

    def members(self, group: str) -> str:
        return self._of_app(group, "members")

    def member_info(self, group: str) -> str:
        return self._of_app(group, "member-info")

    def members_version(self, group: str) -> str:
        return self._of_app(group, "members-version")

    def fenced_acks(self, group: str, queue: int) -> str:
        """Acknowledgements refused by fencing, a hash by stale lease value: one per app
        on a standalone server, one per app and queue (in the queue's slot) on a cluster."""
        name = f"{self.app(group)}:fenced-acks"
        return self._of_queue(name, queue) if self.cluster else name


# Stream entry ids <-> sequence tokens: an entry id ``MS-SEQ`` of queue Q is ``Q:MS-SEQ``.
def token_of(entry_id: bytes, queue: int) -> SequenceToken:
    ms, _, seq = entry_id.partition(b"-")
    return SequenceToken(queue, int(ms), int(seq or 0))


def joined_ids(tokens: Sequence[SequenceToken]) -> bytes:
    """Entry ids, space-separated: one script argument instead of one per id."""
    return b" ".join([b"%d-%d" % (t.major, t.minor) for t in tokens])


def _credential(env_name: str) -> str | None:
    return os.environ.get(env_name) or None if env_name else None


class _CPacking:
    """Commands packed by hiredis' C packer, not redis-py's Python one (asyncio).

    redis-py packs each argument in Python, re-joining a growing buffer: a publish
    passes seven arguments per message, and that packing cost ~4.5 us a message against
    ~0.7 here (measured on 62-entry calls). The wire bytes are the same.
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
            async with asyncio.timeout(timeout_s):
                await send(command, check_health)
        except TimeoutError:  # asyncio's: redis-py's own TimeoutError is no subclass
            await conn.disconnect(nowait=True)
            raise rex.TimeoutError("Timeout writing to socket") from None
        finally:
            conn.socket_timeout = timeout_s


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

CLUSTER_ERRORS = (rex.MovedError, rex.AskError, rex.TryAgainError, rex.ClusterDownError,
                  rex.SlotNotCoveredError, rex.ClusterError)
"""A slot moved, migrating, or not served for now (a failover): worth a retry once the
client has re-read the cluster's slots."""


def _c_packed(client: aioredis.Redis) -> None:
    pool = client.connection_pool  # connections open lazily: none exists yet
    pool.connection_class = _C_PACKED.get(pool.connection_class, pool.connection_class)


def connect(cfg: Any) -> Any:
    """A client for ``[redis]`` of the config (connections are opened lazily): an
    ``aioredis.Redis``, or a :class:`ClusterClient` with ``mode = "cluster"``.

    redis-py's own retries are disabled: a blind retry of ``XREADGROUP`` could strand
    entries in the pending list; :class:`Caller` decides what may be retried.
    """
    url = cfg.url
    mode = getattr(cfg, "mode", "standalone")
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
        client = aioredis.Redis.from_url(url, retry_on_timeout=False, **kwargs)
    except ValueError as exc:  # redis-py quotes the URL: do not repeat it
        raise ConfigError(f"$.redis.url {redact_url(url)}: {type(exc).__name__}") from None
    _c_packed(client)
    return client


def _connect_cluster(url: str, kwargs: dict[str, Any]) -> ClusterClient:
    # As redis-py's from_url does for one server: the URL's options win.
    options = {**kwargs, **rconn.parse_url(url)}
    options.pop("db", None)
    if options.pop("connection_class", None) is rconn.SSLConnection:
        options["ssl"] = True
    node_kwargs = {k: v for k, v in options.items() if k not in ("host", "port")}
    # redis-py caps a cluster node's pool at 100 connections and then fails calls at
    # once; a daemon holds one per queue it is reading (a blocking XREADGROUP), so the
    # cap is a standalone pool's: none in practice.
    client = ClusterClient(**options, node_kwargs=node_kwargs, max_connections=2**31)
    # The cluster's node connections pack with hiredis too (ClusterNode reads the class
    # from these keyword arguments when the topology is first read).
    conn_kwargs = client.nodes_manager.connection_kwargs
    conn_kwargs["connection_class"] = _C_PACKED.get(conn_kwargs["connection_class"],
                                                    conn_kwargs["connection_class"])
    return client


def sentinel_addresses(sentinels: Sequence[str]) -> list[tuple[str, int]]:
    """``[redis] sentinels`` (``HOST[:PORT]``, ``[IPV6][:PORT]``; checked when the config
    loads) as the ``(host, port)`` pairs redis-py takes."""
    addresses = []
    for item in sentinels:
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        addresses.append((host, int(port or SENTINEL_PORT)))
    return addresses


def _connect_sentinel(cfg: Any, url: str, kwargs: dict[str, Any]) -> SentinelClient:
    # The URL's options win, as in from_url; its host and port are the sentinels' to say.
    options = {**kwargs, **rconn.parse_url(url)}
    options.pop("host", None)
    options.pop("port", None)
    tls = options.pop("connection_class", None) is rconn.SSLConnection
    options["connection_class"] = _C_PACKED[SentinelManagedSSLConnection if tls
                                            else SentinelManagedConnection]
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
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        sentinel_addresses(cfg.sentinels), sentinel_kwargs=sentinel_kwargs, **options)
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


REPORT_EVERY_S = 5.0
"""How often an outage that lasts is logged again."""

# Errors worth retrying: the server is restarting, loading, or the network is down.
RETRYABLE = (rex.ConnectionError, rex.TimeoutError, OSError, BrokerConnectionError,
             *CLUSTER_ERRORS)


@contextlib.contextmanager
def map_errors(what: str) -> Iterator[None]:
    """Translate redis-py's exceptions into Conveyor's error tree."""
    try:
        yield
    except (rex.AuthenticationError, rex.AuthorizationError) as exc:
        raise BrokerError(f"redis refused the credentials while {what}: {exc}") from None
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        raise BrokerConnectionError(f"redis unreachable while {what}: {exc}") from exc
    except rex.ReadOnlyError as exc:  # with mode = "sentinel" redis-py reconnects instead
        raise BrokerError(
            f"redis refused a write while {what}: the server is a replica (READONLY); point "
            f'[redis] url at the primary, or let Sentinel find it (mode = "sentinel")'
        ) from exc
    except CLUSTER_ERRORS as exc:
        raise BrokerConnectionError(
            f"redis cluster not serving the slot while {what} (a failover or a slot "
            f"moving): {type(exc).__name__}: {exc}") from exc
    except rex.RedisError as exc:
        raise BrokerError(f"redis error while {what}: {exc}") from exc


class Caller:
    """Runs broker calls with translated errors and, where safe, retries.

    Retries use tenacity: exponential back-off from 0.05 s with jitter (up to a quarter
    of the cap), capped at ``retry_max_delay_s``, for at most ``retry_max_s``. An outage
    is logged once when it starts, every few seconds while it lasts, and once when it ends.
    """

    def __init__(self, cfg: Any, redis: Any) -> None:
        self.redis = redis
        self.url = server_name(cfg)
        self.retry_max_s = cfg.retry_max_s
        self.retry_max_delay_s = cfg.retry_max_delay_s
        self.backoff = Backoff(first_s=0.05, cap_s=cfg.retry_max_delay_s,
                               jitter_s=cfg.retry_max_delay_s / 4)
        self.outage = OutageLog(log, "redis", self.url, REPORT_EVERY_S)

    def ok(self) -> None:
        self.outage.ok()

    async def once(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One attempt (for calls that must not be repeated blindly)."""
        try:
            with map_errors(what):
                result = await fn()
        except BrokerConnectionError as exc:
            self.outage.failing(what, exc.__cause__ or exc)
            raise
        self.ok()
        return result

    async def retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry ``fn`` on connection errors (idempotent calls, or at-least-once ones).

        The first attempt runs bare: building tenacity's retry state costs ~45 µs, more
        than a whole batch's acknowledgement. Only once it fails does the back-off loop
        start (its first attempt is immediate), within what is left of ``retry_max_s``.
        """
        started = time.monotonic()
        try:
            with map_errors(what):
                result = await fn()
        except RETRYABLE:
            left = self.retry_max_s - (time.monotonic() - started)
            if left <= 0:
                raise
        else:
            self.ok()
            return result

        def before_sleep(state: RetryCallState) -> None:
            if state.outcome is not None and (exc := state.outcome.exception()) is not None:
                self.outage.failing(what, exc)

        retrying = AsyncRetrying(
            stop=stop_after_delay(left),
            wait=self.backoff.tenacity_wait(),
            retry=retry_if_exception_type(RETRYABLE),
            before_sleep=before_sleep,
            reraise=True,
        )
        with map_errors(what):
            async for attempt in retrying:
                with attempt:
                    result = await fn()
        self.ok()
        return result
