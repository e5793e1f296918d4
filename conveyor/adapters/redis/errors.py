"""Redis calls as Conveyor sees them: redis-py's exceptions translated into Conveyor's
error tree (:func:`map_errors`), and :class:`Caller`, which runs a call once or retries it
with back-off, logging an outage once when it starts and once when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import redis.exceptions as rex
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay

from conveyor.adapters.redis.urls import server_name
from conveyor.platform.backoff import Backoff
from conveyor.platform.config import RedisConfig
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    ConveyorError,
    error_text,
)
from conveyor.platform.outage import OutageLog

log = logging.getLogger("conveyor.redis")

T = TypeVar("T")


CLUSTER_ERRORS = (rex.MovedError, rex.AskError, rex.TryAgainError, rex.ClusterDownError,
                  rex.SlotNotCoveredError, rex.ClusterError)
"""A slot moved, migrating, or not served for now (a failover): worth a retry once the
client has re-read the cluster's slots."""


class ClusterUnreachableError(rex.ConnectionError, BrokerConnectionError):
    """No node of a cluster answered while its slots were read, before any command went
    out. redis-py says so with a ``RedisClusterException``, no ``RedisError``: this
    ``ConnectionError`` takes its place (``ClusterClient.initialize``), so it is retried
    and reported as any unreachable server is (and is a Conveyor error, as every error
    Conveyor raises, should one reach a caller unmapped)."""


class NotAClusterError(rex.RedisClusterException, ConveyorError):
    """``mode = "cluster"`` and a server not in cluster mode: the config's mistake (it
    names no cluster), reported by :func:`map_errors` as one on ``$.redis.mode``."""


class SentinelCredentialsRefused(rex.AuthenticationError, ConveyorError):
    """The sentinels refused the credentials of ``[redis] sentinel_username_env`` /
    ``sentinel_password_env`` (or their absence), and none named a primary: the config's
    mistake, reported by :func:`map_errors` as one on ``$.redis.sentinel_password_env``.
    An ``AuthenticationError``, so that whatever treats refused credentials as no outage
    (no retry) treats these so too; its text names each sentinel and what was sent,
    never a password."""


REPORT_EVERY_S = 5.0
"""How often an outage that lasts is logged again."""

# Errors worth retrying: the server is restarting, loading, or the network is down.
RETRYABLE = (rex.ConnectionError, rex.TimeoutError, OSError, BrokerConnectionError,
             *CLUSTER_ERRORS)


def wrong_type(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Redis refusing a command on a key of another type
    (``WRONGTYPE``: a string where a stream belongs, say)."""
    return isinstance(exc, rex.ResponseError) and str(exc).startswith("WRONGTYPE")


def unblocked(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Redis ending a blocking ``XREADGROUP`` because its stream's key
    left the server (``UNBLOCKED the stream key no longer exists``, Redis 7): deleted, or
    moved to another node with its slot (a reshard's ``MIGRATE``). Nothing was read."""
    return isinstance(exc, rex.ResponseError) and str(exc).startswith("UNBLOCKED")


def wrong_database(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Redis refusing the database number of ``[redis] url``
    (``/99`` on a server with 16): sent with every connection, so every call fails so."""
    return isinstance(exc, rex.ResponseError) and "DB index is out of range" in str(exc)


def wrong_type_line(key: str, holds: str, found: str, wanted: str, effect: str) -> str:
    """One line for an operator on a key of another type: ``redis key KEY (HOLDS) is a
    FOUND, not a WANTED: EFFECT`` (``effect`` ends with what to do)."""
    return f"redis key {key} ({holds}) is a {found}, not a {wanted}: {effect}"


@contextlib.contextmanager
def map_errors(what: str) -> Iterator[None]:
    """Translate redis-py's exceptions into Conveyor's error tree."""
    try:
        yield
    except SentinelCredentialsRefused as exc:  # before the data nodes' refusal: its kind
        raise ConfigError(
            f"$.redis.sentinel_password_env: the sentinels refused the credentials ({exc}, "
            f"while {what}): give the sentinels' own password (their requirepass) in the "
            "variable sentinel_password_env names, and their user, if any, in the one "
            "sentinel_username_env names; the data nodes' are username_env / password_env"
        ) from None
    except rex.AuthenticationError as exc:  # the config's mistake too: no retry helps
        said = str(exc).rstrip(".")
        raise ConfigError(
            f"$.redis.url: the server refused the credentials ({said}, while {what}): give "
            "the user and password in the URL (redis://USER:PASSWORD@HOST/DB) or in the "
            "variables named by [redis] username_env / password_env") from None
    except rex.AuthorizationError as exc:  # TLS: the server's certificate failed OCSP
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
            f"moving): {error_text(exc)}") from exc
    except rex.RedisError as exc:
        if wrong_database(exc):  # the config's mistake, not the broker's: no retry helps
            raise ConfigError(
                f"$.redis.url: the server has no database of that number ({exc}, while "
                f"{what}): a Redis server has `databases` of them, 16 by default, "
                "numbered from 0") from None
        raise BrokerError(f"redis error while {what}: {exc}") from exc
    except NotAClusterError as exc:
        raise ConfigError(f'$.redis.mode: "cluster", but {exc} (while {what}): point '
                          '$.redis.url at a node of a cluster, or set mode = "standalone"'
                          ) from None
    except rex.RedisClusterException as exc:  # no RedisError: a misuse
        raise BrokerError(f"redis cluster error while {what}: {exc}") from exc


class Caller:
    """Runs broker calls with translated errors and, where safe, retries.

    Retries use tenacity: exponential back-off from 0.05 s with jitter (up to a quarter
    of the cap), capped at ``retry_max_delay_s``, for at most ``retry_max_s``. An outage
    is logged once when it starts, every few seconds while it lasts, and once when it ends,
    in the log every caller of the server shares (:meth:`OutageLog.of_server`).
    """

    def __init__(self, cfg: RedisConfig, redis: Any) -> None:
        self.redis = redis
        self.url = server_name(cfg)
        self.retry_max_s = cfg.retry_max_s
        self.retry_max_delay_s = cfg.retry_max_delay_s
        self.backoff = Backoff(first_s=0.05, cap_s=cfg.retry_max_delay_s,
                               jitter_s=cfg.retry_max_delay_s / 4)
        self.outage = OutageLog.of_server(
            log, "redis", self.url, REPORT_EVERY_S,
            f" for up to {cfg.retry_max_s:g}s a call ([redis] retry_max_s)")

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
