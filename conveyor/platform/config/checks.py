"""Checks of a whole config that msgspec's per-field constraints cannot express.

Combinations of fields, names checked by the rules of the broker they reach, and text
free of control characters. Each failure is a :class:`ConfigError` naming the field's
path; :meth:`conveyor.platform.config.Config.validate` runs them when a config loads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from conveyor.platform.config.hosts import check_host
from conveyor.platform.config.redis_url import check_url as check_redis_url
from conveyor.platform.errors import ConfigError
from conveyor.platform.ids import NAME

if TYPE_CHECKING:
    from conveyor.platform.config import Config

KAFKA_TOPIC_MAX = 249 - len(".conveyor-handoff")
"""Kafka allows 249 characters; the longest topic Conveyor derives from ``[kafka] topic``
is ``<topic>.conveyor-handoff`` (as long as ``<topic>.conveyor-dlq-ops``; the other is
``<topic>.conveyor-dlq``)."""


def validate(config: Config) -> None:
    """Raise a ConfigError for the first check ``config`` fails."""
    if config.slots.kind == "custom" and ":" not in config.slots.path:
        raise ConfigError(
            f"$.slots.path: a custom slot supplier needs path = \"package.module:Factory\", "
            f"got {config.slots.path!r}"
        )
    if config.slots.resource.min_slots > config.slots.resource.max_slots:
        raise ConfigError("$.slots.resource.min_slots: must not exceed max_slots")
    if config.redis.min_replicas and (
        config.redis.replica_timeout_ms >= config.redis.socket_timeout_s * 1000
    ):
        raise ConfigError(
            f"$.redis.replica_timeout_ms: {config.redis.replica_timeout_ms} must be below "
            f"$.redis.socket_timeout_s ({config.redis.socket_timeout_s:g} s): a WAIT that "
            "outlasts the socket timeout would look like a lost connection"
        )
    rate = config.slots.rate
    if (
        rate.per_second is not None
        and rate.store == "redis"
        and "redis" not in (config.queues.adapter, config.balancer.membership)
    ):
        raise ConfigError(
            '$.slots.rate.store: "redis" shares the limit through [redis] url, but this '
            "config uses no Redis (queues.adapter and balancer.membership are "
            f'{config.queues.adapter!r}/{config.balancer.membership!r}); use store = "local" '
            "for a per-daemon limit"
        )
    if (
        config.queues.adapter == "redis"
        and config.balancer.kind == "dynamic"
        and config.balancer.membership != "redis"
    ):
        raise ConfigError(
            f"$.balancer.membership: the redis adapter with the dynamic balancer needs "
            f'membership = "redis" (its acks are fenced by leases kept in Redis), '
            f"got {config.balancer.membership!r}"
        )
    if config.balancer.kind == "kafka-group" and config.queues.adapter != "kafka":
        raise ConfigError(
            f'$.balancer.kind: "kafka-group" needs queues.adapter = "kafka", '
            f"got {config.queues.adapter!r}"
        )
    if config.dead_letters.max_entries and config.queues.adapter == "kafka":
        raise ConfigError(
            "$.dead_letters.max_entries: not supported on kafka, whose dead-letter topic "
            "is bounded by its own retention (retention.ms / retention.bytes); leave it 0"
        )
    if config.balancer.queues and config.balancer.kind != "static":
        raise ConfigError(
            f"$.balancer.queues: only the static balancer owns named queues; with kind = "
            f"{config.balancer.kind!r} they would be ignored (remove them, or set kind = "
            '"static")')
    twice = sorted({q for q in config.balancer.queues if config.balancer.queues.count(q) > 1})
    if twice:
        raise ConfigError(f"$.balancer.queues: queues {twice} are named more than once")
    if config.slots.path and config.slots.kind != "custom":
        raise ConfigError(
            f"$.slots.path: only a custom slot supplier is built from a path; with kind = "
            f'{config.slots.kind!r} it would be ignored (remove it, or set kind = "custom")')
    bad = [q for q in config.balancer.queues if not 0 <= q < config.queues.total]
    if bad:
        raise ConfigError(
            f"$.balancer.queues: queues {bad} do not exist "
            f"(queues are 0..{config.queues.total - 1})"
        )
    _check_text(config)
    _check_names(config)
    _check_timing(config)
    weights = config.balancer.weights
    if weights.cpu_usage + weights.memory_usage + weights.available_memory == 0:
        raise ConfigError(
            "$.balancer.weights: cpu_usage, memory_usage and available_memory are all 0; "
            "at least one must be > 0 (they are normalised to sum to 1)"
        )


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a builtins tree (keys too), with its path; free-form options aside."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict) and path != "$.slots.options":  # the user's factory's
        for key, item in value.items():
            yield from _strings(key, path)
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_text(config: Config) -> None:
    """No string anywhere holds a control character (a newline in a key, a NUL in a path)."""
    for path, text in _strings(msgspec.to_builtins(config), "$"):
        if _CONTROL.search(text):
            raise ConfigError(f"{path}: control characters are not allowed, got {text!r}")


_KAFKA_TOPIC = re.compile(rf"[A-Za-z0-9._\-]{{1,{KAFKA_TOPIC_MAX}}}")
KAFKA_STRING_MAX = 2**15 - 1
"""The longest string the Kafka protocol carries (a signed 16-bit length), in bytes."""
_KAFKA_NAME = re.compile(r"[A-Za-z0-9._\-]{1,249}")
"""Kafka's rule for names it checks like topics (``group.instance.id``)."""
_ENV_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)?")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::([0-9]{1,5}))?")


def check_bootstrap(bootstrap: str, field: str = "$.kafka.bootstrap") -> None:
    """``HOST[:PORT][,HOST[:PORT]...]`` (port 9092 if left out), each port 1-65535; a
    ConfigError naming ``field`` else."""
    for item in bootstrap.split(","):
        found = _HOST_PORT.fullmatch(item.strip())
        if found is None or not 0 < int(found.group(1) or 9092) < 65536:
            raise ConfigError(
                f"{field}: expected HOST:PORT[,HOST:PORT...], got {bootstrap!r}")
        check_host(_host_of(found), field)


def _host_of(found: re.Match[str]) -> str:
    """The host of a :data:`_HOST_PORT` match."""
    return found.group(0)[: found.start(1) - 1] if found.group(1) else found.group(0)


def _check_names(config: Config) -> None:
    """Names that reach a broker, checked by the broker's own rules (whole-string matches)."""
    if not NAME.fullmatch(config.redis.prefix):
        raise ConfigError(
            f"$.redis.prefix: use 1-128 ASCII letters, digits, '_', '.', '-' (it starts every "
            f"Redis key), got {config.redis.prefix!r}"
        )
    topic = config.kafka.topic
    if not _KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise ConfigError(
            f"$.kafka.topic: a Kafka topic name is 1-{KAFKA_TOPIC_MAX} ASCII letters, digits, "
            f"'.', '_', '-', not '.' or '..' ({KAFKA_TOPIC_MAX} leaves room for "
            f"'<topic>.conveyor-handoff' within Kafka's 249), got {topic!r}"
        )
    assignors = config.kafka.assignors
    if not assignors or len(set(assignors)) != len(assignors):
        raise ConfigError(
            f"$.kafka.assignors: name 'sticky' and/or 'roundrobin', each once, preferred "
            f"first, got {assignors!r}"
        )
    instance = config.kafka.group_instance_id
    if instance and (not _KAFKA_NAME.fullmatch(instance) or instance in (".", "..")):
        raise ConfigError(
            f"$.kafka.group_instance_id: Kafka checks it like a topic name: 1-249 ASCII "
            f"letters, digits, '.', '_', '-', not '.' or '..' (empty: dynamic membership), "
            f"got {instance!r}"
        )
    client_id = len(config.kafka.client_id.encode())
    if client_id > KAFKA_STRING_MAX:
        raise ConfigError(f"$.kafka.client_id: at most {KAFKA_STRING_MAX} bytes in UTF-8 (a "
                          f"Kafka protocol string), got {client_id}")
    check_bootstrap(config.kafka.bootstrap)
    _check_sentinels(config)
    if config.queues.adapter == "kafka":
        _check_kafka_security(config)
    if _uses_redis(config):  # an unused [redis] url (a shell's CONVEYOR_REDIS__URL) is no error
        check_redis_url(config.redis.url, cluster=config.redis.mode == "cluster")
        _check_redis_tls(config)
    for path, name in (
        ("$.redis.username_env", config.redis.username_env),
        ("$.redis.password_env", config.redis.password_env),
        ("$.redis.sentinel_username_env", config.redis.sentinel_username_env),
        ("$.redis.sentinel_password_env", config.redis.sentinel_password_env),
        ("$.kafka.sasl_password_env", config.kafka.sasl_password_env),
        ("$.kafka.ssl_key_password_env", config.kafka.ssl_key_password_env),
    ):
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{path}: expected the name of an environment variable, got {name!r}")
    check_host(config.http.host, "$.http.host")
    endpoint = config.telemetry.endpoint
    if endpoint and not _http_url(endpoint):
        raise ConfigError(
            f"$.telemetry.endpoint: expected an http:// or https:// URL, got {endpoint!r}"
        )
    exporter = config.telemetry.exporter
    for field, given in (("endpoint", endpoint), ("headers", config.telemetry.headers)):
        if given and exporter != "otlp":  # would be dropped without a word
            raise ConfigError(
                f'$.telemetry.{field}: only used with exporter = "otlp", got exporter = '
                f'"{exporter}"; set exporter = "otlp" or remove {field}')


SENTINEL_PORT = 26379
"""Where a sentinel listens unless ``[redis] sentinels`` names a port."""


def _check_sentinels(config: Config) -> None:
    """``[redis] sentinels`` and ``sentinel_service``: set with ``mode = "sentinel"``
    only, then at least one ``HOST[:PORT]`` and a name sentinels accept."""
    redis = config.redis
    if redis.mode != "sentinel":
        if redis.sentinels:
            raise ConfigError(
                f'$.redis.sentinels: only used with mode = "sentinel", got mode = '
                f'"{redis.mode}"; set mode = "sentinel" or remove sentinels'
            )
        return
    if not redis.sentinels:
        raise ConfigError(
            '$.redis.sentinels: mode = "sentinel" needs the sentinels\' addresses, '
            'e.g. ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]'
        )
    for i, item in enumerate(redis.sentinels):
        found = _HOST_PORT.fullmatch(item)
        if found is None or not 0 < int(found.group(1) or SENTINEL_PORT) < 65536:
            raise ConfigError(
                f"$.redis.sentinels[{i}]: expected HOST[:PORT] (port {SENTINEL_PORT} if "
                f"left out), got {item!r}"
            )
        check_host(_host_of(found), f"$.redis.sentinels[{i}]")
    if not NAME.fullmatch(redis.sentinel_service):
        raise ConfigError(
            f"$.redis.sentinel_service: the name the sentinels monitor the primary under "
            f"(1-128 ASCII letters, digits, '_', '.', '-'), got {redis.sentinel_service!r}"
        )


def _http_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _check_timing(config: Config) -> None:
    """Durations that only make sense in a given order."""
    redis, kafka = config.redis, config.kafka
    if redis.heartbeat_interval_s >= redis.member_ttl_s:
        raise ConfigError(
            f"$.redis.heartbeat_interval_s: must be below member_ttl_s ({redis.member_ttl_s}), "
            f"or live daemons drop out of the membership between heartbeats; "
            f"got {redis.heartbeat_interval_s}"
        )
    if kafka.heartbeat_interval_ms >= kafka.session_timeout_ms:
        raise ConfigError(
            f"$.kafka.heartbeat_interval_ms: must be below session_timeout_ms "
            f"({kafka.session_timeout_ms}), got {kafka.heartbeat_interval_ms}"
        )
    if kafka.command_timeout_ms <= kafka.fetch_max_wait_ms:
        raise ConfigError(
            f"$.kafka.command_timeout_ms: must exceed fetch_max_wait_ms "
            f"({kafka.fetch_max_wait_ms}), which a fetch at a partition's end waits for its "
            f"answer; got {kafka.command_timeout_ms}"
        )
    if config.queues.adapter == "redis" and redis.socket_timeout_s * 1000 <= (
        config.worker.poll_timeout_ms
    ):
        raise ConfigError(
            f"$.redis.socket_timeout_s: must exceed worker.poll_timeout_ms "
            f"({config.worker.poll_timeout_ms} ms), the longest blocking read; "
            f"got {redis.socket_timeout_s}"
        )


def _check_kafka_security(config: Config) -> None:
    """TLS files or a SASL user that ``security_protocol`` does not use: the clients
    would talk plain text, or log in as nobody, without a word."""
    kafka = config.kafka
    protocol = kafka.security_protocol
    if not protocol.endswith("SSL"):
        for field in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_env"):
            if getattr(kafka, field):
                raise ConfigError(
                    f"$.kafka.{field}: set, but $.kafka.security_protocol is {protocol!r} "
                    "(no TLS), so it would not be used; use \"SSL\" or \"SASL_SSL\", or "
                    "remove it")
    if not protocol.startswith("SASL") and kafka.sasl_username:
        raise ConfigError(
            f"$.kafka.sasl_username: set, but $.kafka.security_protocol is {protocol!r} "
            "(no SASL), so no login would happen; use \"SASL_SSL\" or \"SASL_PLAINTEXT\", "
            "or remove it")


def _check_redis_tls(config: Config) -> None:
    """TLS files with a ``redis://`` URL: the connection would be plain text, the files
    unread, without a word (the URL's scheme alone turns TLS on)."""
    redis = config.redis
    if redis.url.partition("://")[0].lower() == "rediss":
        if redis.tls_key_file and not redis.tls_cert_file:
            raise ConfigError("$.redis.tls_key_file: the key of a client certificate, but "
                              "$.redis.tls_cert_file is empty; set both, or neither")
        return
    for field in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        if getattr(redis, field):
            raise ConfigError(
                f"$.redis.{field}: set, but $.redis.url is not rediss:// (TLS), so it "
                "would not be used and the connection would be plain text; use "
                "rediss://, or remove it")


def _uses_redis(config: Config) -> bool:
    """Whether anything in ``config`` connects to ``[redis] url``: the redis adapter or
    redis membership (an app-wide rate limit kept in Redis needs one of them)."""
    return config.queues.adapter == "redis" or config.balancer.membership == "redis"
