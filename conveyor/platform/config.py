"""Configuration: TOML files decoded into msgspec Structs, then environment overrides.

Precedence, lowest to highest: the Struct defaults, the TOML file, ``CONVEYOR_*``
environment variables, CLI flags. An environment variable names a path of sections and a
field separated by double underscores: ``CONVEYOR_WORKER__DRAIN_TIMEOUT_S=5`` sets
``[worker] drain_timeout_s``, ``CONVEYOR_SLOTS__RESOURCE__MIN_SLOTS=2`` sets
``[slots.resource] min_slots``. The value is read as the field's type: text for a string
field (``CONVEYOR_KAFKA__TOPIC=123`` is the topic ``"123"``), a number or
``true``/``false`` for scalars, JSON for lists and tables
(``CONVEYOR_BALANCER__QUEUES=[0,1]``). Every error names the field's path
(``$.worker.slots``) and where the bad value came from.
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


AdapterName = Literal["memory", "redis", "kafka"]
MembershipName = Literal["memory", "redis"]


class QueuesConfig(_Section):
    adapter: AdapterName = "memory"
    """Backend: ``memory`` (embedded, in-process), ``redis`` or ``kafka``."""
    total: PositiveInt = 8
    """Queues on the hash ring; every producer and daemon of an app must agree."""


class MemoryConfig(_Section):
    broker: str = "default"
    """Name of the in-process broker; clients and daemons in one process share it by name."""


class RedisConfig(_Section):
    url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` (TLS). Keep passwords out of files: put them in the
    variables named by ``username_env`` / ``password_env`` (or in CONVEYOR_REDIS__URL)."""
    prefix: str = "conveyor"
    """Start of every key Conveyor writes (letters, digits, ``_.-``)."""
    username_env: str = "CONVEYOR_REDIS_USERNAME"
    """Environment variable holding the username (overrides the URL's) when set."""
    password_env: str = "CONVEYOR_REDIS_PASSWORD"
    """Environment variable holding the password (overrides the URL's) when set."""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_verify: bool = True
    """Verify the server's certificate and host name (``rediss://`` only)."""
    connect_timeout_s: PositiveFloat = 2.0
    socket_timeout_s: PositiveFloat = 5.0
    """Longest wait for one reply; must exceed ``worker.poll_timeout_ms`` (blocking reads)."""
    retry_max_s: PositiveFloat = 10.0
    """How long one broker call is retried (exponential back-off with jitter) before the
    error reaches its caller, which retries in turn: a daemon outlives any outage."""
    retry_max_delay_s: PositiveFloat = 1.0
    """Cap of the back-off between two retries."""
    claim_batch: PositiveInt = 1000
    """Entries claimed per XAUTOCLAIM step when a queue changes owner."""
    retention_s: NonNegativeFloat = 3600.0
    """Entries every group has acknowledged are kept this long (for rewinds), then trimmed.
    Entries some group has not acknowledged are never trimmed."""
    trim_interval_s: PositiveFloat = 5.0
    """How often the owner of a queue trims it."""
    member_ttl_s: PositiveFloat = 3.0
    """A daemon whose heartbeats stop vanishes from the membership this long after the last."""
    heartbeat_interval_s: PositiveFloat = 1.0


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


class ResourceSlotsConfig(_Section):
    """The resource-based supplier: issue slots while CPU and memory stay below targets."""

    target_cpu: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    """Fraction of the CPU limit (cgroup v2 ``cpu.max``, else all host cores) to aim for."""
    target_memory: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    """Fraction of the memory limit (``memory.max``, else host RAM), anonymous memory only."""
    min_slots: PositiveInt = 1
    max_slots: PositiveInt = 10_000
    ramp_throttle_ms: NonNegativeFloat = 50.0
    """Least time between two slots issued above ``min_slots``, so load can show up."""
    sample_period_ms: PositiveFloat = 100.0


class SlotsConfig(_Section):
    kind: Literal["fixed", "resource-based", "custom"] = "fixed"
    """``fixed``: ``count`` slots. ``resource-based``: see ``[slots.resource]``.
    ``custom``: a user-written supplier built by ``path``."""
    count: PositiveInt = 64
    """Handler invocations that may be in flight at once in one daemon (fixed supplier)."""
    pauseable: bool = False
    """Wrap the supplier so ``daemon.slots.pause()`` / ``resume()`` work."""
    path: str = ""
    """``custom``: ``"package.module:Factory"``, called as ``Factory(**options)``."""
    options: dict[str, Any] = {}
    """``custom``: keyword arguments for the factory."""
    resource: ResourceSlotsConfig = msgspec.field(default_factory=ResourceSlotsConfig)


class CellsConfig(_Section):
    """Sizes of cells (handlers declared with ``cell_key=``); override the handler's own."""

    default_size: PositiveInt | None = None
    """Workers of a cell not named in ``sizes``; unset: the handler's ``cell_size`` (4)."""
    sizes: dict[str, PositiveInt] = {}
    """Cell name (``tenant-a``), or ``handler-name/cell`` for one handler, to its size."""


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


class DeadLettersConfig(_Section):
    """Where messages that cannot be handled go, and what happens to unroutable ones."""

    unroutable: Literal["skip", "dead-letter"] = "skip"
    """A message of a namespace no handler of this app subscribes to. Apps that share
    queues (one Redis prefix, one Kafka topic) each see every message, so by default it
    is another app's: ``skip`` acknowledges it for this app and counts it (``skipped``);
    ``dead-letter`` stores it in this app's dead letters first. Logged at most once a
    minute per namespace either way."""
    max_entries: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Most dead letters kept per app (redis, memory); 0 keeps every one. When a new
    letter goes past the bound the oldest are evicted, counted (``dead_letters_evicted``
    in ``conveyor status``) and logged. On Kafka the dead-letter topic's retention is the
    bound: Conveyor creates it with ``retention.ms = -1`` (kept forever); set
    ``max_entries`` only with redis or memory."""


class SupervisorConfig(_Section):
    """``conveyor worker --processes MIN:MAX``: when to add and remove daemon processes."""

    lag_per_process: PositiveInt = 1000
    """Add a process when the app's lag divided by the process count stays above this."""
    idle_lag_per_process: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """A process whose queues lag by at most this is idle (removable); default: 5% of
    ``lag_per_process``."""
    inspection_period_ms: PositiveFloat = 500.0
    scale_up_cycles: PositiveInt = 2
    """Consecutive inspections above the threshold before a process is added."""
    scale_up_backoff_s: NonNegativeFloat = 2.0
    """Least time between two additions (a new process needs a moment to show effect)."""
    scale_down_dead_zone_cycles: PositiveInt = 2
    scale_down_backoff_s: NonNegativeFloat = 2.0


class PlacementConfig(_Section):
    """Weights of ``placement = "resource"`` (normalised; lowest score wins)."""

    cpu_usage: NonNegativeFloat = 0.5
    memory_usage: NonNegativeFloat = 0.25
    available_memory: NonNegativeFloat = 0.25
    local_margin: NonNegativeFloat = 0.05
    """A queue stays with its owner while the owner's cost is within this of the best."""


class BalancerConfig(_Section):
    kind: Literal["dynamic", "static", "kafka-group"] = "dynamic"
    """``dynamic``: share queues among live daemons and re-balance as they come and go.
    ``static``: own exactly ``queues`` (all queues when empty).
    ``kafka-group``: let Kafka's consumer-group coordinator share the partitions
    (kafka adapter only; needs no other store)."""
    queues: list[int] = []
    rebalance_interval_s: PositiveFloat = 1.0
    """How often a daemon re-checks its share even without a membership event."""
    membership: MembershipName = "memory"
    """Where daemons register and leases live: ``memory`` (daemons of one process) or
    ``redis`` (daemons on any machine, heartbeats and TTLs in ``[redis]``). The redis
    adapter with the ``dynamic`` balancer needs ``redis``: its acks are fenced by leases
    kept in Redis. The kafka adapter works with either (``memory`` shares partitions
    among the daemons of one process only)."""
    placement: Literal["best-fit", "resource"] = "best-fit"
    """``dynamic`` only. ``best-fit``: an even, deterministic split. ``resource``: power-of-K
    choices (K = ceil(sqrt(n))) over the CPU and memory each daemon publishes, filtered
    by CDM-KF; busier daemons get fewer queues."""
    weights: PlacementConfig = msgspec.field(default_factory=PlacementConfig)
    lease_ttl_s: PositiveFloat = 5.0
    """A queue's lease lapses this long after its owner's last renewal; a dead daemon's
    queues are taken over after at most this long."""


class TelemetryConfig(_Section):
    exporter: Literal["none", "console", "otlp"] = "none"
    """``none``: no instrumentation runs at all. ``console``: spans and metrics to stderr.
    ``otlp``: OTLP over HTTP/protobuf (Jaeger, an OpenTelemetry collector, ...)."""
    endpoint: str = ""
    """OTLP base URL, e.g. ``http://localhost:4318``; empty: the standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` environment variable, else the exporter's default."""
    headers: dict[str, str] = {}
    """Extra OTLP headers (e.g. an API key); the standard OTEL_EXPORTER_OTLP_HEADERS also works."""
    service_name: str = "conveyor"
    resource_attributes: dict[str, str] = {}
    metrics_interval_s: PositiveFloat = 10.0
    """How often metrics are exported (and queue lag sampled)."""
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    """Share of traces recorded where they start (parent-based: consumers follow the
    producer). Spans are the main cost of tracing: lower this on hot paths."""


class Config(_Section):
    queues: QueuesConfig = msgspec.field(default_factory=QueuesConfig)
    memory: MemoryConfig = msgspec.field(default_factory=MemoryConfig)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    kafka: KafkaConfig = msgspec.field(default_factory=KafkaConfig)
    slots: SlotsConfig = msgspec.field(default_factory=SlotsConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    cells: CellsConfig = msgspec.field(default_factory=CellsConfig)
    dead_letters: DeadLettersConfig = msgspec.field(default_factory=DeadLettersConfig)
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    balancer: BalancerConfig = msgspec.field(default_factory=BalancerConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)

    def validate(self) -> Config:
        """Cross-field checks msgspec cannot express."""
        if self.slots.kind == "custom" and ":" not in self.slots.path:
            raise ConfigError(
                f"$.slots.path: a custom slot supplier needs path = \"package.module:Factory\", "
                f"got {self.slots.path!r}"
            )
        if self.slots.resource.min_slots > self.slots.resource.max_slots:
            raise ConfigError("$.slots.resource.min_slots: must not exceed max_slots")
        if (
            self.queues.adapter == "redis"
            and self.balancer.kind == "dynamic"
            and self.balancer.membership != "redis"
        ):
            raise ConfigError(
                f"$.balancer.membership: the redis adapter with the dynamic balancer needs "
                f'membership = "redis" (its acks are fenced by leases kept in Redis), '
                f"got {self.balancer.membership!r}"
            )
        if self.balancer.kind == "kafka-group" and self.queues.adapter != "kafka":
            raise ConfigError(
                f'$.balancer.kind: "kafka-group" needs queues.adapter = "kafka", '
                f"got {self.queues.adapter!r}"
            )
        if self.dead_letters.max_entries and self.queues.adapter == "kafka":
            raise ConfigError(
                "$.dead_letters.max_entries: not supported on kafka, whose dead-letter topic "
                "is bounded by its own retention (retention.ms / retention.bytes); leave it 0"
            )
        bad = [q for q in self.balancer.queues if not 0 <= q < self.queues.total]
        if bad:
            raise ConfigError(
                f"$.balancer.queues: queues {bad} do not exist "
                f"(queues are 0..{self.queues.total - 1})"
            )
        return self


_JSON_TYPES = (
    msgspec.inspect.ListType,
    msgspec.inspect.DictType,
    msgspec.inspect.StructType,
    msgspec.inspect.AnyType,
)


def _needs_json(t: msgspec.inspect.Type) -> bool:
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_needs_json(member) for member in t.types)
    return isinstance(t, _JSON_TYPES)


def _env_value(name: str, text: str, t: msgspec.inspect.Type) -> Any:
    """Read an environment value as the target field's type.

    Scalars stay text: the final ``msgspec.convert(strict=False)`` turns ``"9"`` into an
    int or ``"true"`` into a bool for such fields, and leaves a string field's text
    alone. Only lists, tables and free-form values are JSON. A JSON string literal
    (``"x"``, quotes included) is unquoted, so values written with ``json.dumps`` (the
    supervisor hands CLI overrides to its children so) read the same as plain text.
    """
    if not _needs_json(t):
        if len(text) >= 2 and text[0] == text[-1] == '"':
            try:
                return msgspec.json.decode(text, type=str)
            except msgspec.DecodeError:
                pass
        return text
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"environment variable {name}: expected JSON ({exc})") from None


def _table(raw: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """The sub-table ``raw[key]``, created when absent; a ConfigError when not a table."""
    value = raw.setdefault(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
    return value


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``CONVEYOR_SECTION__[SUB__]FIELD`` variables onto a raw config mapping."""
    root = msgspec.inspect.type_info(Config)
    assert isinstance(root, msgspec.inspect.StructType)
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        struct = root
        target = raw
        for depth, part in enumerate(path):
            here = "$." + ".".join(path[: depth + 1])
            fields = {f.name: f.type for f in struct.fields}
            if part not in fields:
                what = f"no config section [{part}]" if depth == 0 else (
                    f"unknown field `{part}` at `{here.rpartition('.')[0]}`"
                )
                raise ConfigError(f"environment variable {name}: {what}")
            t = fields[part]
            if depth == len(path) - 1:
                target[part] = _env_value(name, value, t)
            elif isinstance(t, msgspec.inspect.StructType):
                target, struct = _table(target, part, here), t
            else:
                raise ConfigError(
                    f"environment variable {name}: {here} is not a table; "
                    f"set it whole (JSON for a list or table)"
                )
    return raw


def _convert(raw: dict[str, Any], source: str) -> Config:
    try:
        return msgspec.convert(raw, Config, strict=False).validate()
    except (msgspec.ValidationError, ConfigError) as exc:
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
        _table(raw, section, f"{source}: $.{section}").update(values)
    return _convert(raw, source + " (with CONVEYOR_* environment)")
