"""Configuration: TOML files decoded into msgspec Structs, then environment overrides.

Precedence, lowest to highest: the Struct defaults, the TOML file, ``CONVEYOR_*``
environment variables, CLI flags. An environment variable names a section and a field
separated by a double underscore: ``CONVEYOR_WORKER__DRAIN_TIMEOUT_S=5`` sets
``[worker] drain_timeout_s``. Every error names the field's path (``$.worker.slots``)
and where the bad value came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from conveyor.platform.errors import ConfigError

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
ENV_PREFIX = "CONVEYOR_"


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class QueuesConfig(_Section):
    adapter: str = "memory"
    """Backend: ``memory`` (embedded, in-process), ``redis`` or ``kafka``."""
    total: PositiveInt = 8
    """Queues on the hash ring; every producer and daemon of an app must agree."""


class MemoryConfig(_Section):
    broker: str = "default"
    """Name of the in-process broker; clients and daemons in one process share it by name."""


class RedisConfig(_Section):
    url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "conveyor"


class KafkaConfig(_Section):
    bootstrap: str = "127.0.0.1:9092"
    """``HOST:PORT[,HOST:PORT...]`` of the brokers."""
    topic: str = "conveyor"
    """One topic per app deployment; partition ``i`` is queue ``i``."""
    default_namespace: str = "default"
    """Namespace of a record that carries no ``cv-ns`` header (published by a plain client)."""
    create_topic: bool = True
    """Create the topic (``queues.total`` partitions) with the admin client if absent."""
    replication_factor: PositiveInt = 1
    client_id: str = "conveyor"
    linger_ms: Annotated[int, msgspec.Meta(ge=0)] = 2
    fetch_max_wait_ms: PositiveInt = 100
    """Longest a fetch waits on the broker for data (bounds pull latency on idle queues)."""
    session_timeout_ms: PositiveInt = 10_000
    """``kafka-group`` balancer: a member silent this long is dropped from the group."""
    heartbeat_interval_ms: PositiveInt = 1_000
    rebalance_timeout_ms: PositiveInt = 60_000
    """``kafka-group`` balancer: how long members may take to drain on a re-balance."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str = ""
    sasl_password_env: str = "CONVEYOR_KAFKA_PASSWORD"
    """Name of the environment variable holding the SASL password (never the password)."""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_key_password_env: str = ""
    """Name of the environment variable holding the client key's password, if any."""


class SlotsConfig(_Section):
    kind: Literal["fixed"] = "fixed"
    count: PositiveInt = 64
    """Handler invocations that may be in flight at once in one daemon (fixed supplier)."""


class WorkerConfig(_Section):
    cache_capacity: PositiveInt = 1024
    """Messages one pulling agent may hold (pulled, not yet acked) before it stops pulling."""
    max_batch: PositiveInt = 256
    """Most messages one pull asks the queue for."""
    poll_timeout_ms: PositiveInt = 500
    """How long one blocking pull waits for the first message of an idle queue."""
    drain_timeout_s: NonNegativeFloat = 30.0
    """On shutdown, how long in-flight messages may take to finish before they are abandoned
    unacknowledged (to be redelivered to the next owner)."""


class BalancerConfig(_Section):
    kind: Literal["dynamic", "static", "kafka-group"] = "dynamic"
    """``dynamic``: share queues among live daemons and re-balance as they come and go.
    ``static``: own exactly ``queues`` (all queues when empty).
    ``kafka-group``: let Kafka's consumer-group coordinator share the partitions
    (kafka adapter only; needs no other store)."""
    queues: list[int] = []
    rebalance_interval_s: PositiveFloat = 1.0
    """How often a daemon re-checks its share even without a membership event."""
    membership: str = "memory"
    """Where daemons register and leases live: ``memory`` (daemons of one process)."""
    lease_ttl_s: PositiveFloat = 5.0
    """A queue's lease lapses this long after its owner's last renewal; a dead daemon's
    queues are taken over after at most this long."""


class Config(_Section):
    queues: QueuesConfig = msgspec.field(default_factory=QueuesConfig)
    memory: MemoryConfig = msgspec.field(default_factory=MemoryConfig)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    kafka: KafkaConfig = msgspec.field(default_factory=KafkaConfig)
    slots: SlotsConfig = msgspec.field(default_factory=SlotsConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    balancer: BalancerConfig = msgspec.field(default_factory=BalancerConfig)

    def validate(self) -> Config:
        """Cross-field checks msgspec cannot express."""
        bad = [q for q in self.balancer.queues if not 0 <= q < self.queues.total]
        if bad:
            raise ConfigError(
                f"$.balancer.queues: queues {bad} do not exist "
                f"(queues are 0..{self.queues.total - 1})"
            )
        return self


def _env_value(text: str) -> Any:
    """Interpret an environment value: JSON when it parses (numbers, bools, lists)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``CONVEYOR_SECTION__FIELD`` variables onto a raw config mapping."""
    sections = {f.name for f in msgspec.structs.fields(Config)}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        if section not in sections:
            raise ConfigError(f"environment variable {name}: no config section [{section}]")
        target = raw.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"$.{section}: expected a table")
        target[field] = _env_value(value)
    return raw


def _convert(raw: dict[str, Any], source: str) -> Config:
    try:
        return msgspec.convert(raw, Config, strict=False).validate()
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Load a config file (or the defaults when ``path`` is None) and apply overrides."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {source}: {exc.strerror}") from None
        try:
            raw = msgspec.toml.decode(text)
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    raw = apply_env(raw, os.environ if environ is None else environ)
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update(values)
    return _convert(raw, source + " (with CONVEYOR_* environment)")
