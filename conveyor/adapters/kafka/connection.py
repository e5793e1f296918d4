"""Kafka connections: client options from config, error translation, outage back-off.

:func:`client_options` turns ``[kafka]`` into the keyword arguments every aiokafka
client (producer, consumer, admin) takes; secrets are read from the environment
variables the config names, never from the config itself, and never appear in an
error message. :func:`kafka_errors` translates aiokafka's exceptions at the boundary
(through :func:`broker_error`); :func:`start_client` starts a producer or consumer so.
:func:`admin` opens and closes an admin client around a block.
:func:`outage_log` and :func:`retrying` are how a daemon waits for a broker that is down:
capped, jittered exponential back-off (tenacity), logged once when the outage starts,
every ``REPORT_EVERY_S`` while it lasts, and once when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kerrors
from aiokafka.admin import AIOKafkaAdminClient
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from conveyor.adapters.kafka.aiokafka_internals import (
    INIT_PRODUCER_ID_ERROR,
    SCRAM_STEPS,
    SENDER_LOGGER,
    bootstrap_unreachable,
)
from conveyor.platform.backoff import Backoff
from conveyor.platform.config import KafkaConfig
from conveyor.platform.errors import BrokerConnectionError, BrokerError, ConfigError, error_text
from conveyor.platform.outage import OutageLog
from conveyor.platform.throttled_log import RepeatFilter

log = logging.getLogger("conveyor.kafka")

T = TypeVar("T")

RETRY_MAX_DELAY_S = 5.0
"""Longest wait between two attempts to reach a broker that is down."""
OUTAGE_BACKOFF = Backoff(first_s=0.1, cap_s=RETRY_MAX_DELAY_S, jitter_s=RETRY_MAX_DELAY_S / 4)
"""How :func:`retrying` waits for a broker that is down (0.1 s doubling to 5 s)."""
REPORT_EVERY_S = 30.0
"""How often an outage that lasts is logged again."""
FIRST_ANSWER_S = 5.0
"""Longest a daemon's start waits on a first connection attempt that neither succeeds
nor fails (a host that drops packets); the attempt goes on in the background."""


def client_options(cfg: KafkaConfig) -> dict[str, Any]:
    """Connection options shared by producer, consumers and admin; secrets from env."""
    opts: dict[str, Any] = {
        "bootstrap_servers": cfg.bootstrap,
        "client_id": cfg.client_id,
        "security_protocol": cfg.security_protocol,
    }
    if cfg.security_protocol.startswith("SASL"):
        password = os.environ.get(cfg.sasl_password_env)
        if not cfg.sasl_username or password is None:
            missing = "$.kafka.sasl_username is empty" if not cfg.sasl_username else (
                f"the environment variable {cfg.sasl_password_env!r} "
                "($.kafka.sasl_password_env) is not set"
            )
            raise ConfigError(
                f"$.kafka: {cfg.security_protocol} needs sasl_username and the password "
                f"in the environment variable named by sasl_password_env ({missing})"
            )
        opts.update(
            sasl_mechanism=cfg.sasl_mechanism,
            sasl_plain_username=cfg.sasl_username,
            sasl_plain_password=password,
        )
    if cfg.security_protocol.endswith("SSL"):
        opts["ssl_context"] = _ssl_context(cfg)
    return opts


def _ssl_context(cfg: KafkaConfig) -> Any:
    from aiokafka.helpers import create_ssl_context

    key_env = cfg.ssl_key_password_env
    key_password = os.environ.get(key_env) if key_env else None
    if key_env and key_password is None:
        raise ConfigError(
            f"$.kafka.ssl_key_password_env: the environment variable {key_env!r} is not set"
        )
    try:
        return create_ssl_context(
            cafile=cfg.ssl_cafile or None,
            certfile=cfg.ssl_certfile or None,
            keyfile=cfg.ssl_keyfile or None,
            password=key_password,
        )
    except (OSError, ValueError) as exc:
        # ssl's own messages name no secret ("[SSL] PEM lib", "No such file"), but
        # only the type and the file names are repeated, to be sure of it.
        files = {"ssl_cafile": cfg.ssl_cafile, "ssl_certfile": cfg.ssl_certfile,
                 "ssl_keyfile": cfg.ssl_keyfile}
        named = ", ".join(f"{k}={v!r}" for k, v in files.items() if v)
        raise ConfigError(
            f"$.kafka: cannot build the SSL context from {named or 'the defaults'} "
            f"({type(exc).__name__}; check the files and the key password)"
        ) from None


CLIENT_ERRORS: tuple[type[BaseException], ...] = (kerrors.KafkaError, OSError, KeyError, ValueError)
"""What starting an aiokafka client may raise: its own errors, the network's, and the
``KeyError`` / ``ValueError`` its SCRAM code raises when the broker refuses a login."""

_AUTH_ERRORS = (kerrors.SaslAuthenticationFailed, kerrors.AuthenticationFailedError,
                kerrors.AuthenticationMethodNotSupported)


def is_login_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker refusing a SASL login.

    aiokafka reports a refused SCRAM login as a ``KeyError: 'v'`` (the server's final
    message holds an error ``e=...`` where the client expects its signature ``v=...``)
    or a ``ValueError`` from the same code, so those count when raised there.
    """
    if isinstance(exc, _AUTH_ERRORS):
        return True
    if isinstance(exc, KeyError | ValueError):
        frames = traceback.extract_tb(exc.__traceback__)
        return any(f.name in SCRAM_STEPS and "aiokafka" in f.filename for f in frames)
    return False


def broker_error(what: str, exc: BaseException) -> BrokerError:
    """Translate an aiokafka error at the boundary (retriable ones as connection errors).

    A refused login says so. A ``KeyError`` / ``ValueError`` that is not one (caught
    through :data:`CLIENT_ERRORS`) is re-raised unchanged: a bug is not a broker error.
    """
    if isinstance(exc, KeyError | ValueError) and not is_login_failure(exc):
        raise exc
    if is_login_failure(exc):
        detail = str(exc) if isinstance(exc, kerrors.KafkaError) else "the broker refused it"
        return BrokerError(
            f"kafka: {what} failed: authentication failed ({detail}); check "
            "$.kafka.sasl_mechanism, $.kafka.sasl_username and the password in the "
            "variable $.kafka.sasl_password_env names"
        )
    if isinstance(exc, kerrors.UnsupportedCodecError):  # another producer compressed
        return BrokerError(
            f"kafka: {what} failed: {exc} (a producer compressed the batch, e.g. a Java "
            "client's compression.type): install the codecs with pip install "
            "'aiokafka[lz4,snappy,zstd]'; the queue waits for them, nothing is skipped"
        )
    retriable = isinstance(exc, kerrors.KafkaConnectionError | kerrors.KafkaTimeoutError | OSError)
    if isinstance(exc, kerrors.KafkaError) and exc.retriable:
        retriable = True
    cls = BrokerConnectionError if retriable else BrokerError
    unreachable = bootstrap_unreachable(exc)
    if unreachable is not None:
        return cls(f"kafka: {what} failed: no broker reachable at {', '.join(unreachable)} "
                   "($.kafka.bootstrap)")
    # aiokafka's errors name their class themselves ("KafkaConnectionError: ...").
    detail = str(exc) if isinstance(exc, kerrors.KafkaError) else error_text(exc)
    return cls(f"kafka: {what} failed: {detail}")


@contextlib.contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Translate what aiokafka raises in the block into Conveyor's errors (see
    :func:`broker_error`): the one place the adapters' calls are mapped at the boundary.

    Errors of aiokafka a caller expects (``CommitFailedError`` after a re-balance, say)
    are caught inside the block, where the caller decides what they mean.
    """
    try:
        yield
    except CLIENT_ERRORS as exc:
        raise broker_error(what, exc) from exc


async def start_client(client: Any, what: str) -> None:
    """Start an aiokafka producer or consumer, errors translated.

    A failed or cancelled start leaves nothing open: the client is stopped before the
    error (or the cancellation) goes on.
    """
    try:
        with kafka_errors(what):
            await client.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await client.stop()
        raise


NO_PRODUCER_IDS = (kerrors.UnknownError, kerrors.UnsupportedVersionError)
"""What a broker without idempotence answers InitProducerId with (tansu 0.6: UnknownError)."""

_starting_producer: ContextVar[bool] = ContextVar("conveyor_starting_producer", default=False)
"""True in :func:`start_producer` and in the tasks its producer starts (they copy it)."""


class _ProducerIdRefusalFilter(logging.Filter):
    """Drops aiokafka's ``ERROR ... Unexpected error during InitProducerIdRequest`` for a
    producer :func:`start_producer` starts when the broker refuses producer ids: that
    function reports the refusal itself, in one line (a warning, or the error under
    ``idempotence = "on"``). Any other error of aiokafka's sender is left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            _starting_producer.get()
            and str(record.msg).startswith(INIT_PRODUCER_ID_ERROR)
            and isinstance(record.args, tuple) and bool(record.args)
            and record.args[0] in NO_PRODUCER_IDS
        )


logging.getLogger(SENDER_LOGGER).addFilter(_ProducerIdRefusalFilter())


CONNECT_REPEAT_S = 30.0
"""How often aiokafka's line for one unreachable address passes (the outage log's own
repeat: :mod:`conveyor.platform.outage`)."""
_CONNECT_FAILURES = ('Unable connect to "%s:%s": %s', "Unable connect to node with id %s: %s",
                     "Unable to update metadata from %s")


def _connect_failure(record: logging.LogRecord) -> tuple[str, ...] | None:
    """aiokafka's client logs an error at every attempt to reach a broker that is down —
    every 1-5 s of an outage, from each client of the process. One line per address (or
    node) passes every :data:`CONNECT_REPEAT_S`, with how many more there were
    (:class:`~conveyor.platform.throttled_log.RepeatFilter`); every other line of
    aiokafka's passes as it is. Conveyor's own outage log says when the outage starts,
    lasts and ends."""
    if record.msg not in _CONNECT_FAILURES or not isinstance(record.args, tuple):
        return None
    fmt = record.msg
    where = record.args if fmt.endswith("from %s") else record.args[:-1]
    return (fmt, *map(str, where))


logging.getLogger("aiokafka").addFilter(
    RepeatFilter(_connect_failure, lambda: CONNECT_REPEAT_S))  # aiokafka.client's logger

_PRODUCE_FAILURES = ("Got error produce response: %s",
                     "Got error produce response on topic-partition %s, retrying. Error: %s")


def _produce_failure(record: logging.LogRecord) -> tuple[str, ...] | None:
    """aiokafka's sender logs a warning at each failed produce request, and retries it
    every ``retry_backoff_ms`` (100 ms) while the broker is down: some 30 lines a second
    of an outage under a publish. One line of each kind (the format, and the error's type
    or the partition and error) passes every :data:`CONNECT_REPEAT_S`, as the client's
    connect failures do; the publish's own error says what became of its messages."""
    if record.msg not in _PRODUCE_FAILURES or not isinstance(record.args, tuple):
        return None
    if record.msg == _PRODUCE_FAILURES[0] and record.args:
        return (record.msg, type(record.args[0]).__name__)
    return (record.msg, *map(str, record.args))


logging.getLogger(SENDER_LOGGER).addFilter(
    RepeatFilter(_produce_failure, lambda: CONNECT_REPEAT_S))


_WARNED_NO_IDS: set[str] = set()
"""Bootstrap lists whose broker refused a producer id, warned of: once a process (a
process that starts many producers — a client per request, ``conveyor bench`` — logged
the same line for each); later refusals are logged at debug level."""


async def start_producer(cfg: KafkaConfig, options: dict[str, Any]) -> AIOKafkaProducer:
    """A started producer with ``acks=all``, idempotent as ``$.kafka.idempotence`` asks.

    ``auto`` falls back to a plain producer, with a one-line warning (once a process for
    each broker: :data:`_WARNED_NO_IDS`), only when the broker refuses to hand out a
    producer id; an unreachable broker is an error as always.
    """
    common = {"linger_ms": cfg.linger_ms, "acks": "all",
              "max_request_size": cfg.max_request_size, **options}
    if cfg.idempotence != "off":
        producer = AIOKafkaProducer(enable_idempotence=True, **common)
        asking = _starting_producer.set(True)
        try:
            await start_client(producer, "connecting the idempotent producer")
            return producer
        except BrokerError as exc:
            if not isinstance(exc.__cause__, NO_PRODUCER_IDS):
                raise
            refusal = f"InitProducerId answered {type(exc.__cause__).__name__}"
            if cfg.idempotence == "on":
                raise BrokerError(
                    f"kafka: the broker hands out no producer ids ({refusal}), and "
                    "$.kafka.idempotence is \"on\": set it to \"auto\" or \"off\" to "
                    "publish without the idempotent producer"
                ) from exc
            first = cfg.bootstrap not in _WARNED_NO_IDS
            _WARNED_NO_IDS.add(cfg.bootstrap)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "kafka: the broker at %s hands out no producer ids (%s): publishing "
                "without idempotence, so a send retried after a cut connection may be "
                "written twice ([kafka] idempotence = \"off\" skips asking, \"on\" refuses)",
                cfg.bootstrap, refusal)
        finally:
            _starting_producer.reset(asking)
    producer = AIOKafkaProducer(**common)
    await start_client(producer, "connecting the producer")
    return producer


async def start_admin(options: dict[str, Any]) -> AIOKafkaAdminClient:
    """A started admin client; a failed or cancelled start closes it before the error
    goes on. Errors are not translated here: the caller's :func:`kafka_errors` (or its
    own handler) decides what they mean."""
    client = AIOKafkaAdminClient(**options)
    try:
        await client.start()
    except BaseException:
        await close_admin(client)
        raise
    return client


async def close_admin(client: AIOKafkaAdminClient) -> None:
    with contextlib.suppress(Exception):
        await client.close()


@contextlib.asynccontextmanager
async def admin(options: dict[str, Any]) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client for the block, closed after it however the block ends
    (a one-off; :meth:`KafkaCluster.admin` keeps one per cluster)."""
    client = await start_admin(options)
    try:
        yield client
    finally:
        await close_admin(client)


def outage_log(bootstrap: str) -> OutageLog:
    """How one adapter logs an unreachable cluster (``bootstrap`` holds no credentials)."""
    return OutageLog(log, "kafka", bootstrap, REPORT_EVERY_S,
                     f" (at most {RETRY_MAX_DELAY_S:.0f}s apart)")


async def retrying(outage: OutageLog, what: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Call ``fn`` until it stops raising :class:`BrokerConnectionError`.

    No attempt limit: a daemon waits for its broker as long as it takes, and the wait is
    cancellable (a SIGTERM while waiting cancels it). Other errors propagate at once.
    """

    def before_sleep(state: RetryCallState) -> None:
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            outage.failing(what, exc)

    retry = AsyncRetrying(
        wait=OUTAGE_BACKOFF.tenacity_wait(),
        retry=retry_if_exception_type(BrokerConnectionError),
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retry:
        with attempt:
            result = await fn()
    outage.ok()
    return result


async def first_answer(task: asyncio.Future[Any], outage: OutageLog,
                       timeout_s: float = FIRST_ANSWER_S) -> None:
    """Wait until ``task`` is done, an outage is known, or ``timeout_s`` has passed.

    For a start that should fail fast on a configuration error but not wait out a
    broker outage. ``task`` is never cancelled here.
    """
    down = asyncio.ensure_future(outage.reported.wait())
    try:
        await asyncio.wait([task, down], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        down.cancel()
