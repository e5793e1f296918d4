"""Configuration: TOML files decoded into msgspec Structs, then environment overrides.

Precedence, lowest to highest: the Struct defaults, the TOML file, ``CONVEYOR_*``
environment variables, CLI flags. An environment variable names a path of sections and a
field separated by double underscores: ``CONVEYOR_WORKER__DRAIN_TIMEOUT_S=5`` sets
``[worker] drain_timeout_s``, ``CONVEYOR_SLOTS__RESOURCE__MIN_SLOTS=2`` sets
``[slots.resource] min_slots``. The value is read as the field's type: text for a string
field (``CONVEYOR_KAFKA__TOPIC=123`` is the topic ``"123"``), a number or
``true``/``false`` for scalars, JSON for lists and tables
(``CONVEYOR_BALANCER__QUEUES=[0,1]``). A variable naming a whole section
(``CONVEYOR_WORKER={"drain_timeout_s": 5}``) holds a JSON table merged into it; a variable
for one of its fields wins over it. Other ``CONVEYOR_*`` names (``CONVEYOR_REDIS_PASSWORD``)
and every variable a ``*_env`` field names are not config and are left alone. Every error
names the field's path (``$.worker.slots``) and where the bad value came from.

Bounds are checked when the config loads: every duration is finite, at least 1 ms (zero
only where it means "none", as in ``drain_timeout_s``) and at most a day (``retention_s``: a
year); names that reach a broker are checked against the broker's own rules (see
:meth:`Config.validate`).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Annotated, Any, Literal

import msgspec

from conveyor.platform.config import checks as config_checks
from conveyor.platform.errors import ConfigError, InvalidArgumentError
from conveyor.platform.mapper import MAX_QUEUES as MAX_QUEUES

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]

DAY_S = 86_400.0
YEAR_S = 365 * DAY_S
Seconds = Annotated[float, msgspec.Meta(ge=0.001, le=DAY_S)]
"""A duration: at least 1 ms (the resolution of every TTL and timeout handed to Redis or
Kafka; below it a periodic task spins), at most a day. Both bounds refuse ``inf`` and
``nan``, which TOML and the environment would otherwise let through."""
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=DAY_S)]
"""A duration where 0 means none (no back-off, no wait)."""
Millis = Annotated[int, msgspec.Meta(ge=1, le=int(DAY_S * 1000))]
MillisOrZero = Annotated[int, msgspec.Meta(ge=0, le=int(DAY_S * 1000))]
MillisFloat = Annotated[float, msgspec.Meta(ge=1, le=DAY_S * 1000)]
MillisFloatOrZero = Annotated[float, msgspec.Meta(ge=0, le=DAY_S * 1000)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
Weight = Annotated[float, msgspec.Meta(ge=0, le=1000)]

MAX_BODY_BYTES = 512 << 20
"""Redis' largest bulk argument (``proto-max-bulk-len``'s default)."""
DEFAULT_MAX_BODY_BYTES = 16 << 20
MAX_CELL_SIZE = 10_000

ENV_PREFIX = "CONVEYOR_"


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every section: keyword-only fields; an unknown field is an error naming its
    path."""


AdapterName = Literal["memory", "redis", "kafka"]
MembershipName = Literal["memory", "redis"]


class QueuesConfig(_Section):
    """``[queues]``: which backend holds the queues, and how many queues the ring has."""

    adapter: AdapterName = "memory"
    """Backend: ``memory`` (embedded, in-process), ``redis`` or ``kafka``."""
    total: Annotated[int, msgspec.Meta(ge=1, le=MAX_QUEUES)] = 8
    """Queues on the hash ring; every producer and daemon of an app must agree. At most
    4096: each queue is a Redis stream or a Kafka partition (Kafka advises a few thousand
    partitions per broker at most) and a pulling agent in the daemon that owns it, and a
    ring of 4096 already spreads streams over far more daemons than one app runs."""
    new_group_start: Literal["earliest", "latest"] = "earliest"
    """Where an app starts on a queue it has never read (its consumer group is created
    there): ``earliest``, every message the queue still keeps (nothing published before
    the app's first daemon is missed); ``latest``, only what is published from then on.
    A group that exists keeps its position either way (``conveyor rewind`` moves it).
    See docs/apps-on-one-broker.md."""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_BODY_BYTES)] = DEFAULT_MAX_BODY_BYTES
    """Largest message body a client publishes, in bytes (16 MiB); a larger one is
    refused before anything is sent (:class:`~conveyor.MessageTooLargeError`; in a
    ``publish_batch``, the whole batch). At most 512 MiB, Redis' largest argument. On
    Kafka the whole record must also fit ``[kafka] max_request_size``. See
    docs/limits.md."""


class MemoryConfig(_Section):
    """``[memory]``: the embedded in-process adapter (``queues.adapter = "memory"``)."""

    broker: str = "default"
    """Name of the in-process broker; clients and daemons in one process share it by name."""


class RedisConfig(_Section):
    """``[redis]``: the server, credentials and TLS, retries, retention, and the heartbeats of
    ``balancer.membership = "redis"`` (``queues.adapter = "redis"``)."""

    url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` (TLS). Keep passwords out of files: put them in the
    variables named by ``username_env`` / ``password_env`` (or in CONVEYOR_REDIS__URL)."""
    mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    """``cluster``: ``url`` names any node of a Redis Cluster (database 0); keys are laid
    out with hash tags so that every script touches one slot (docs/redis.md).
    ``sentinel``: the primary is the one ``sentinels`` name for ``sentinel_service``,
    asked again on every new connection (after a failover too); ``url`` gives the
    scheme (``rediss://``: TLS to data nodes and sentinels), credentials, database and
    options of the data nodes, and its host and port are not used. Keys keep the
    standalone layout."""
    sentinels: list[str] = msgspec.field(default_factory=list)
    """``mode = "sentinel"`` only: ``HOST[:PORT]`` of each Sentinel (port 26379 by
    default); name several, any one that answers will do."""
    sentinel_service: str = "mymaster"
    """The name the sentinels monitor the primary under (``sentinel monitor NAME ...``)."""
    sentinel_username_env: str = ""
    """Environment variable holding the username for the sentinels (``mode =
    "sentinel"``), when they require one; empty: none."""
    sentinel_password_env: str = ""
    """Environment variable holding the sentinels' password (``requirepass`` in their
    config); empty: none. The data nodes' credentials are ``username_env`` /
    ``password_env``."""
    prefix: str = "conveyor"
    """Start of every key Conveyor writes (letters, digits, ``_.-``)."""
    username_env: str = "CONVEYOR_REDIS_USERNAME"
    """Environment variable holding the username (overrides the URL's) when set."""
    password_env: str = "CONVEYOR_REDIS_PASSWORD"
    """Environment variable holding the password (overrides the URL's) when set."""
    tls_ca_file: str = ""
    """CA bundle to verify the server with (``rediss://``); empty: the system's."""
    tls_cert_file: str = ""
    """Client certificate for mutual TLS (``rediss://``); empty: none."""
    tls_key_file: str = ""
    """The client certificate's private key (``rediss://``)."""
    tls_verify: bool = True
    """Verify the server's certificate and host name (``rediss://`` only)."""
    connect_timeout_s: Seconds = 2.0
    """Longest wait for a new connection to be established."""
    socket_timeout_s: Seconds = 5.0
    """Longest wait for one reply; must exceed ``worker.poll_timeout_ms`` (blocking reads).
    A deadline that passes while the event loop is blocked is put off until the loop has
    run 0.25 s, at most 4 times in a row (``conveyor.platform.deadlines``), as is
    ``connect_timeout_s``'s."""
    retry_max_s: Seconds = 10.0
    """How long one broker call is retried (exponential back-off with jitter) before the
    error reaches its caller, which retries in turn: a daemon outlives any outage."""
    retry_max_delay_s: Seconds = 1.0
    """Cap of the back-off between two retries."""
    claim_batch: PositiveInt = 1000
    """Entries claimed per XAUTOCLAIM step when a queue changes owner."""
    retention_s: Annotated[float, msgspec.Meta(ge=0, le=YEAR_S)] = 3600.0
    """Entries every group has acknowledged are kept this long (for rewinds), then trimmed.
    Entries some group has not acknowledged are never trimmed."""
    trim_interval_s: SecondsOrZero = 5.0
    """How often the owner of a queue trims it (checked on acknowledgement; 0: every time)."""
    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    """Replicated durability: a publish returns only once this many replicas have its
    entries (``WAIT``), else raises ``PublishNotReplicated``; acknowledgements wait the
    same way (and log when they could not). 0: the primary's word is enough."""
    replica_timeout_ms: Millis = 1000
    """How long a write waits for ``min_replicas`` replicas."""
    member_ttl_s: Seconds = 3.0
    """A daemon whose heartbeats stop vanishes from the membership this long after the last."""
    heartbeat_interval_s: Seconds = 1.0
    """Must be below ``member_ttl_s``."""
    allow_eviction: bool = False
    """Run on a server whose ``maxmemory-policy`` is not ``noeviction`` (a warning is
    logged). Refused by default — workers exit 2 at start, a client's first publish
    raises ``ConfigError`` — because a full server then deletes keys: queue streams
    (confirmed messages lost) and, under ``volatile-*`` too, keys with a TTL (leases:
    messages run twice; publish markers: retries written twice). See docs/redis.md,
    "Eviction policy"."""


class KafkaConfig(_Section):
    """``[kafka]``: the brokers and the topic, fetch and consumer-group timings, SASL and TLS
    (``queues.adapter = "kafka"``)."""

    bootstrap: str = "127.0.0.1:9092"
    """``HOST:PORT[,HOST:PORT...]`` of the brokers."""
    topic: str = "conveyor"
    """One topic per app deployment; partition ``i`` is queue ``i``."""
    default_namespace: Annotated[str, msgspec.Meta(min_length=1)] = "default"
    """Namespace of a record that carries no ``cv-ns`` header (published by a plain client).
    Not empty: no handler takes namespace ``""``, so every app would skip such records."""
    create_topic: bool = True
    """Create the topic (``queues.total`` partitions) with the admin client if absent."""
    replication_factor: Annotated[int, msgspec.Meta(ge=1, le=32_767)] = 1
    """Kafka's field is a 16-bit integer."""
    client_id: str = "conveyor"
    """The ``client.id`` the producer and consumers send (broker logs and quotas); at
    most 32767 bytes in UTF-8, a Kafka protocol string."""
    linger_ms: MillisOrZero = 2
    """How long the producer waits to fill a record batch (Kafka's ``linger.ms``)."""
    max_request_size: Annotated[int, msgspec.Meta(ge=1024, le=2**31 - 1)] = 1_048_576
    """Largest produce request, in bytes, as Kafka's producer setting of that name
    (default 1 MiB, Kafka's): one record — body, key, headers and batch framing — must
    fit, else it is refused before anything is sent
    (:class:`~conveyor.MessageTooLargeError`). Raise it together with the broker's
    ``message.max.bytes`` (and the topic's ``max.message.bytes``), or the broker refuses
    what the client lets through. See docs/limits.md."""
    idempotence: Literal["auto", "on", "off"] = "auto"
    """The idempotent producer (``acks=all`` always): a send the client retries after a
    cut connection is written once. ``auto``: on where the broker hands out producer ids,
    else off with a warning (tansu 0.6 does not); ``on``: refuse to publish without it;
    ``off``: never (a retried send may be written twice)."""
    publish_timeout_ms: Millis = 30_000
    """Longest a publish waits without the broker acknowledging any of its records: past
    it the call raises, saying by id which messages were stored, which were not and
    which may or may not have been (docs/kafka.md, "Publishing"). The clock restarts at
    each record batch acknowledged, so a large publish to a working broker is not cut
    short; a publish during an outage fails this long (and up to a second more) after
    the broker last acknowledged one of its batches."""
    fetch_max_wait_ms: Millis = 100
    """Longest a fetch waits on the broker for data (bounds pull latency on idle queues)."""
    command_timeout_ms: Annotated[int, msgspec.Meta(ge=1000, le=int(DAY_S * 1000))] = 10_000
    """Longest an operator's command (``conveyor status``, ``dlq``, ``groups``,
    ``rewind``, the console) waits for the broker's answer to one request: a broker that
    accepts connections and never answers fails the command in about this long, in one
    line (exit 1), as ``[redis] retry_max_s`` (10 s) does on Redis. At least 1 s, and above
    ``fetch_max_wait_ms`` (a fetch at a partition's end is answered after that long). The
    worker daemons' clients keep aiokafka's 40 s: a JoinGroup during a re-balance is
    answered only once every member has re-joined. ``publish`` has its own bound,
    ``publish_timeout_ms``."""
    session_timeout_ms: Millis = 6_000
    """``kafka-group`` balancer: a member silent this long is dropped from the group, and
    its partitions move. 6 s is the least a stock Kafka broker accepts
    (``group.min.session.timeout.ms``); see docs/kafka.md, "Failover"."""
    heartbeat_interval_ms: Millis = 500
    """Must be below ``session_timeout_ms``. Members learn of a re-balance on their next
    heartbeat, so this bounds how long a join or leave waits to be noticed."""
    rebalance_timeout_ms: Millis = 60_000
    """``kafka-group`` balancer: how long members may take to drain on a re-balance (keep
    it above ``worker.drain_timeout_s``)."""
    assignors: list[Literal["sticky", "roundrobin"]] = msgspec.field(
        default_factory=lambda: ["sticky"])
    """``kafka-group`` balancer: the partition assignors a daemon offers, preferred first;
    the group uses one all its members offer. ``sticky`` keeps partitions with their owners
    across re-balances (only what must move moves); ``roundrobin`` deals them anew (all
    earlier Conveyor builds offered only it: list both while upgrading a running app, see
    docs/kafka.md). Offer one where you can: tansu's re-balance window grows with each."""
    group_instance_id: str = ""
    """``kafka-group`` balancer: Kafka static membership (KIP-345, Kafka 2.3+) — this
    daemon's stable name in the group, unique per daemon (a pod name, a host name). A
    daemon restarted under the same name within ``session_timeout_ms`` gets its partitions
    back without a re-balance; a graceful stop does not leave the group. Empty: dynamic
    membership. tansu (the test broker) does not honour it (docs/kafka.md, "Failover")."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How the clients talk to the brokers: plain, TLS, SASL, or SASL over TLS."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    """The SASL mechanism (``SASL_*`` protocols)."""
    sasl_username: str = ""
    """The SASL user; its password is read from ``sasl_password_env``."""
    sasl_password_env: str = "CONVEYOR_KAFKA_PASSWORD"
    """Name of the environment variable holding the SASL password (never the password)."""
    ssl_cafile: str = ""
    """CA bundle to verify the brokers with (``SSL``, ``SASL_SSL``); empty: the system's."""
    ssl_certfile: str = ""
    """Client certificate for mutual TLS; empty: none."""
    ssl_keyfile: str = ""
    """The client certificate's private key."""
    ssl_key_password_env: str = ""
    """Name of the environment variable holding the client key's password, if any."""


class ResourceSlotsConfig(_Section):
    """``[slots.resource]``: the resource-based supplier issues slots while CPU and memory
    stay below targets."""

    target_cpu: Fraction = 0.8
    """Fraction of the CPU limit (cgroup v2 ``cpu.max``, else all host cores) to aim for."""
    target_memory: Fraction = 0.8
    """Fraction of the memory limit (``memory.max``, else host RAM), anonymous memory only."""
    min_slots: PositiveInt = 1
    """Slots issued whatever the load (raise it to the number of queues a daemon owns)."""
    max_slots: PositiveInt = 10_000
    """Most slots issued, however idle the machine."""
    ramp_throttle_ms: MillisFloatOrZero = 50.0
    """Least time between two slots issued above ``min_slots``, so load can show up."""
    sample_period_ms: MillisFloat = 100.0
    """How often CPU and memory are sampled."""


class RateSlotsConfig(_Section):
    """``[slots.rate]``: at most ``per_second`` handler calls start per second (plus a
    ``burst`` after an idle spell), for the whole app or per daemon; off when unset."""

    per_second: Annotated[float, msgspec.Meta(gt=0, le=1_000_000)] | None = None
    """Handler calls started per second; unset: no rate limit (and no wrapper)."""
    burst: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1
    """Calls that may start at once after an idle spell; 1 spaces them evenly."""
    store: Literal["redis", "local"] = "redis"
    """``redis``: one limit shared by every daemon of the app, kept at ``[redis] url``.
    ``local``: a limit per daemon, kept in its process."""


class SlotsConfig(_Section):
    """``[slots]``: the daemon's slot supplier, which decides how many messages are in flight."""

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
    rate: RateSlotsConfig = msgspec.field(default_factory=RateSlotsConfig)


class CellsConfig(_Section):
    """``[cells]``: sizes of cells (handlers declared with ``cell_key=``), over the handler's."""

    default_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_CELL_SIZE)] | None = None
    """Workers of a cell not named in ``sizes``; unset: the handler's ``cell_size`` (4).
    At most 10,000: a cell starts all its workers when its first job arrives."""
    sizes: dict[str, Annotated[int, msgspec.Meta(ge=1, le=MAX_CELL_SIZE)]] = {}
    """Cell name (``tenant-a``), or ``handler-name/cell`` for one handler, to its size."""


class WorkerConfig(_Section):
    """``[worker]``: each pulling agent's cache and pulls, and the drain when a daemon stops."""

    cache_capacity: PositiveInt = 1024
    """Messages one pulling agent may hold (pulled, not yet acked) before it stops pulling."""
    max_batch: PositiveInt = 256
    """Most messages one pull asks the queue for."""
    prefetch_bytes: PositiveInt = 64 << 20
    """Messages one daemon may hold pulled and not yet acknowledged, in bytes, shared
    evenly by its pulling agents (beside each agent's ``cache_capacity``): what bounds a
    daemon's memory when messages are large. A message counts for its body and its
    headers (their names and values, in characters: bytes for ASCII); not for its stream
    key nor Conveyor's own metadata. An agent with nothing in its cache still pulls one
    message, so a message larger than its share still goes through. See docs/limits.md."""
    poll_timeout_ms: Millis = 500
    """How long one blocking pull waits for the first message of an idle queue."""
    drain_timeout_s: SecondsOrZero = 30.0
    """On shutdown, how long in-flight messages may take to finish before they are abandoned
    unacknowledged (to be redelivered to the next owner)."""
    stall_warn_ms: Millis = 500
    """A handler (or anything) that blocks the daemon's event loop this long is a stall:
    logged once it ends — the handler, the message, how long, and the blocking stack — and
    counted (``conveyor_loop_stalls``). Lease renewals and heartbeats do not wait on the
    loop, so a stall shorter than ``balancer.lease_ttl_s`` less its fifth costs no queue;
    a longer one hands the queues over (see docs/handlers.md, "Blocking code")."""
    stall_log_interval_s: Seconds = 60.0
    """At most one stall line per handler this often (the others are counted)."""


class PublishConfig(_Section):
    """``[publish]``: how a :class:`~conveyor.Client` built from this config — and the
    client a worker daemon hands its startup hooks and handlers — sends single
    ``publish`` calls (``publish_batch`` always sends its messages as they come)."""

    coalesce: bool = True
    """Gather ``publish`` calls issued concurrently into rounds, one send for all
    queues: the calls made in one turn of the event loop, and those made while the
    previous round is still on its way, go together. Each call still returns only once
    its message is stored (or raises). Adds no timer: a lone publisher waits one loop turn more. Not
    used on Kafka, whose producer gathers concurrent sends itself (``kafka.linger_ms``),
    nor on the memory adapter (an in-process append has no round trip to share)."""
    linger_ms: MillisFloatOrZero = 0.0
    """With ``coalesce``: how long the first call of a batch waits for others to join
    (Kafka's ``linger.ms``); 0 adds no wait. Only worth it for many publishers that
    each publish rarely."""


class DeadLettersConfig(_Section):
    """``[dead_letters]``: what happens to unroutable messages; how many letters are kept."""

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
    """``[supervisor]``: when ``conveyor worker --processes MIN:MAX`` adds and removes processes."""

    lag_per_process: PositiveInt = 1000
    """Add a process when the app's lag divided by the process count stays above this."""
    idle_lag_per_process: NonNegativeInt | None = None
    """A process whose queues lag by at most this is idle (removable); default: 5% of
    ``lag_per_process``."""
    inspection_period_ms: MillisFloat = 500.0
    """How often the supervisor reads the lag of every queue and decides."""
    scale_up_cycles: PositiveInt = 2
    """Consecutive inspections above the threshold before a process is added."""
    scale_up_backoff_s: SecondsOrZero = 2.0
    """Least time between two additions (a new process needs a moment to show effect)."""
    scale_down_dead_zone_cycles: PositiveInt = 2
    """Consecutive inspections the PID controller must say "fewer" before a process goes."""
    scale_down_backoff_s: SecondsOrZero = 2.0
    """Least time between two removals."""
    silent_child_s: Seconds = 10.0
    """A process that sends its supervisor nothing for this long (it sends a beat every
    0.5 s from a thread of its own, so a blocked event loop does not silence it) is
    stopped (SIGSTOP) or hung holding the interpreter: it is killed and replaced, and its
    queues go to the others."""


class PlacementConfig(_Section):
    """``[balancer.weights]``: weights of ``placement = "resource"`` (normalised; lowest score
    wins): 0 to 1000, not all three zero."""

    cpu_usage: Weight = 0.5
    """Weight of the daemon's CPU use."""
    memory_usage: Weight = 0.25
    """Weight of the daemon's memory use."""
    available_memory: Weight = 0.25
    """Weight of the memory the daemon's host has left (less is worse)."""
    local_margin: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    """A queue stays with its owner while the owner's cost is within this of the best."""


class BalancerConfig(_Section):
    """``[balancer]``: which daemon owns which queue, and where daemons meet (membership and
    leases)."""

    kind: Literal["dynamic", "static", "kafka-group"] = "dynamic"
    """``dynamic``: share queues among live daemons and re-balance as they come and go.
    ``static``: own exactly ``queues`` (all queues when empty).
    ``kafka-group``: let Kafka's consumer-group coordinator share the partitions
    (kafka adapter only; needs no other store)."""
    queues: list[int] = []
    """``static`` only: the queues this daemon owns; empty: all of them."""
    rebalance_interval_s: Seconds = 1.0
    """How often a daemon re-checks its share even without a membership event."""
    membership: MembershipName = "memory"
    """Where daemons register and leases live: ``memory`` (daemons of one process) or
    ``redis`` (daemons on any machine, heartbeats and TTLs in ``[redis]``). The redis
    adapter with the ``dynamic`` balancer needs ``redis``: its acks are fenced by leases
    kept in Redis. The kafka adapter works with either (``memory`` shares partitions
    among the daemons of one process only)."""
    placement: Literal["best-fit", "resource"] = "best-fit"
    """``dynamic`` only. ``best-fit``: an even, deterministic split in which each daemon
    keeps the queues it holds up to its share (only the surplus moves). ``resource``: power-of-K
    choices (K = ceil(sqrt(n))) over the CPU and memory each daemon publishes, filtered
    by CDM-KF; busier daemons get fewer queues."""
    weights: PlacementConfig = msgspec.field(default_factory=PlacementConfig)
    lease_ttl_s: Seconds = 5.0
    """A queue's lease lapses this long after its owner's last renewal; a dead daemon's
    queues are taken over after at most this long."""


class TelemetryConfig(_Section):
    """``[telemetry]``: OpenTelemetry traces and metrics, and where they are exported (off by
    default)."""

    exporter: Literal["none", "console", "otlp"] = "none"
    """``none``: no instrumentation runs at all (but ``[http] port`` still gives
    ``/metrics`` its meter). ``console``: spans and metrics to stderr.
    ``otlp``: OTLP over HTTP/protobuf (Jaeger, an OpenTelemetry collector, ...)."""
    endpoint: str = ""
    """OTLP base URL, e.g. ``http://localhost:4318``; empty: the standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` environment variable, else the exporter's default.
    Set with ``exporter = "otlp"`` only (refused with another exporter, which would
    ignore it)."""
    headers: dict[str, str] = {}
    """Extra OTLP headers (e.g. an API key); the standard OTEL_EXPORTER_OTLP_HEADERS also
    works. Set with ``exporter = "otlp"`` only, as ``endpoint``."""
    service_name: str = "conveyor"
    """The ``service.name`` resource attribute; left at the default, ``OTEL_SERVICE_NAME`` wins
    if set."""
    resource_attributes: dict[str, str] = {}
    """More resource attributes (they win over ``OTEL_RESOURCE_ATTRIBUTES``)."""
    metrics_interval_s: Seconds = 10.0
    """How often metrics are exported (and queue lag sampled)."""
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    """Share of traces recorded where they start (parent-based: consumers follow the
    producer). Spans are the main cost of tracing: lower this on hot paths."""


class HttpConfig(_Section):
    """``[http]``: the worker's HTTP endpoint — ``/metrics`` (Prometheus text format),
    ``/healthz`` and ``/readyz`` (off by default)."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65_535)] | None = None
    """TCP port to serve on; unset: no endpoint (``conveyor worker --http-port`` sets it)."""
    host: str = "0.0.0.0"
    """Address to listen on: all interfaces by default (a scraper or kubelet is another
    host); ``127.0.0.1`` keeps it on this machine."""


class Config(_Section):
    """A whole Conveyor configuration: one field per TOML section, every field defaulted.

    Build one with :func:`load_config` (defaults, the file, ``CONVEYOR_*`` environment
    variables, then overrides), which checks bounds and combinations too; a bad field is a
    :class:`~conveyor.platform.errors.ConfigError` naming its path (``$.worker.slots``).
    """

    queues: QueuesConfig = msgspec.field(default_factory=QueuesConfig)
    memory: MemoryConfig = msgspec.field(default_factory=MemoryConfig)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    kafka: KafkaConfig = msgspec.field(default_factory=KafkaConfig)
    slots: SlotsConfig = msgspec.field(default_factory=SlotsConfig)
    worker: WorkerConfig = msgspec.field(default_factory=WorkerConfig)
    cells: CellsConfig = msgspec.field(default_factory=CellsConfig)
    publish: PublishConfig = msgspec.field(default_factory=PublishConfig)
    dead_letters: DeadLettersConfig = msgspec.field(default_factory=DeadLettersConfig)
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    balancer: BalancerConfig = msgspec.field(default_factory=BalancerConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)

    def validate(self) -> Config:
        """Cross-field checks msgspec cannot express (:mod:`conveyor.platform.config.checks`)."""
        config_checks.validate(self)
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


_SCALARS: dict[type[msgspec.inspect.Type], tuple[type, str]] = {
    msgspec.inspect.IntType: (int, "a whole number"),
    msgspec.inspect.FloatType: (float, "a number"),
    msgspec.inspect.BoolType: (bool, "true or false"),
}
"""A scalar field's type, as an environment value is read (``strict=False``), and as an
error names it."""


def _env_value(name: str, text: str, t: msgspec.inspect.Type, where: str) -> Any:
    """Read an environment value as the target field's type.

    Scalars stay text: the final ``msgspec.convert(strict=False)`` turns ``"9"`` into an
    int or ``"true"`` into a bool for such fields, and leaves a string field's text
    alone. Only lists, tables and free-form values are JSON. A JSON string literal
    (``"x"``, quotes included) is unquoted, so values written with ``json.dumps`` (the
    supervisor hands CLI overrides to its children so) read the same as plain text.
    """
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # bytes the environment held that are not UTF-8
        raise ConfigError(
            f"environment variable {name}: not UTF-8 text (at character {exc.start + 1})"
        ) from None
    if not _needs_json(t):
        if len(text) >= 2 and text[0] == text[-1] == '"':
            try:
                return msgspec.json.decode(text, type=str)
            except msgspec.DecodeError:
                pass
        scalar = _SCALARS.get(type(t))
        if scalar is not None:  # the final conversion's error shows no value: "got `str`"
            try:
                msgspec.convert(text, scalar[0], strict=False)
            except msgspec.ValidationError:
                raise ConfigError(f"environment variable {name}: {where}: expected "
                                  f"{scalar[1]}, got {text!r:.80}") from None
        return text
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"environment variable {name}: expected JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(
            f"environment variable {name}: JSON nested too deeply for any config field"
        ) from None


def _table(raw: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """The sub-table ``raw[key]``, created when absent; a ConfigError when not a table."""
    value = raw.setdefault(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
    return value


def _merge(target: dict[str, Any], table: dict[str, Any],
           struct: msgspec.inspect.StructType) -> None:
    """Merge a section's JSON table into the file's: sub-sections field by field."""
    sections = {f.name: f.type for f in struct.fields
                if isinstance(f.type, msgspec.inspect.StructType)}
    for key, value in table.items():
        sub = sections.get(key)
        if sub is not None and isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, sub)
        else:
            target[key] = value


def _root() -> msgspec.inspect.StructType:
    root = msgspec.inspect.type_info(Config)
    assert isinstance(root, msgspec.inspect.StructType)
    return root


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean `x`?)`` when a choice is close to ``name``, else nothing."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _struct_at(path: str) -> msgspec.inspect.StructType | None:
    """The section a ``$.a.b`` path names (``$``: the root), None if it names none."""
    struct = _root()
    for part in path.split(".")[1:]:
        types = {f.name: f.type for f in struct.fields}
        found = types.get(part)
        if not isinstance(found, msgspec.inspect.StructType):
            return None
        struct = found
    return struct


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`(?: - at `(\$[^`]*)`)?")
_AT_PATH = re.compile(r"- at `(\$[^`]*)`|^(\$[\w.]+):")


def _with_suggestion(message: str) -> str:
    """msgspec's "unknown field `x` - at `$.s`", with the closest field of ``[s]``, else
    the sections that have a field ``x`` (a field written above every ``[section]``
    line, or under the wrong one)."""
    choices = _INVALID_CHOICE.search(message)
    if choices is not None:
        return message + _choices_of(choices.group(1), choices.group(2))
    match = _UNKNOWN_FIELD.search(message)
    struct = _struct_at(match.group(2) or "$") if match else None
    if match is None or struct is None:
        return message
    close = _did_you_mean(match.group(1), (f.name for f in struct.fields))
    if close:
        return message + close
    homes = sorted(_homes(match.group(1), _root(), ""))
    if not homes:
        return message
    return message + f" ({'; '.join(homes[:3])})"


_INVALID_CHOICE = re.compile(r"Invalid enum value (.+?) - at `(\$[\w.]+)(?:\[\d+\])?`")


def _choices_of(value: str, path: str) -> str:
    """`` (one of `a`, `b`; did you mean `a`?)`` for the choice field at ``path``
    (msgspec names neither the choices nor the closest), else nothing."""
    parent, _, name = path.rpartition(".")
    struct = _struct_at(parent)
    kind = None if struct is None else {f.name: f.type for f in struct.fields}.get(name)
    if isinstance(kind, msgspec.inspect.ListType):  # an item of a list: `$.kafka.assignors[0]`
        kind = kind.item_type
    options = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
    values = [str(v) for t in options if isinstance(t, msgspec.inspect.LiteralType)
              for v in t.values]
    if not values:
        return ""
    close = difflib.get_close_matches(value.strip("'\""), values, n=1, cutoff=0.6)
    listed = ", ".join(f"`{v}`" for v in values)
    return f" (one of {listed}{f'; did you mean `{close[0]}`?' if close else ''})"


def _homes(name: str, struct: msgspec.inspect.StructType, path: str) -> Iterable[str]:
    """Where ``name`` is known below ``struct``, as the error says it: the sections with
    a field of that name, or the section of that name."""
    for f in struct.fields:
        here = f"{path}.{f.name}".lstrip(".")
        if f.name == name:
            yield (f"[{here}] is a section" if isinstance(f.type, msgspec.inspect.StructType)
                   else f"[{path}] has `{name}`")
        if isinstance(f.type, msgspec.inspect.StructType):
            yield from _homes(name, f.type, here)


def _apply_one(raw: dict[str, Any], path: list[str], name: str, value: str) -> None:
    struct, target = _root(), raw
    for depth, part in enumerate(path):
        here = "$." + ".".join(path[: depth + 1])
        fields = {f.name: f.type for f in struct.fields}
        if part not in fields:
            what = f"no config section [{part}]" if depth == 0 else (
                f"unknown field `{part}` at `{here.rpartition('.')[0]}`"
            )
            raise ConfigError(f"environment variable {name}: {what}"
                              + _did_you_mean(part, fields))
        t = fields[part]
        if depth == len(path) - 1:
            if not isinstance(t, msgspec.inspect.StructType):
                target[part] = _env_value(name, value, t, here)
                return
            table = _env_value(name, value, t, here)
            if not isinstance(table, dict):
                raise ConfigError(
                    f"environment variable {name}: {here} is a section; expected a JSON "
                    f"table, got {type(table).__name__}"
                )
            _merge(_table(target, part, here), table, t)
        elif isinstance(t, msgspec.inspect.StructType):
            target, struct = _table(target, part, here), t
        else:
            raise ConfigError(
                f"environment variable {name}: {here} is not a table; "
                f"set it whole (JSON for a list or table)"
            )


def apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], *, skip: Set[str] = frozenset(),
    applied: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Overlay ``CONVEYOR_SECTION[__SUB...][__FIELD]`` variables onto a raw config mapping.

    A name without ``__`` is config only when it names a section (``CONVEYOR_WORKER``);
    others (``CONVEYOR_REDIS_PASSWORD``, ``CONVEYOR_REQUIRE_SERVERS``) and the names in
    ``skip`` are left alone. Sections apply before their fields, so the narrower wins.
    ``applied`` receives ``environment variable NAME`` for each variable applied, by the
    ``$.path`` it set (so an error can name the variable at fault).
    """
    sections = {f.name for f in _root().fields}
    found = []
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in skip:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if len(path) == 1 and path[0] not in sections:
            continue
        found.append((path, name, value))
    for path, name, value in sorted(found, key=lambda f: (len(f[0]), f[1])):
        _apply_one(raw, path, name, value)
        if applied is not None:
            applied["$." + ".".join(path)] = f"environment variable {name}"
    return raw


def _secret_variables(raw: Mapping[str, Any]) -> set[str]:
    """The environment variables the ``*_env`` fields of ``raw`` name (or default to)."""
    names: set[str] = set()

    def walk(struct: msgspec.inspect.StructType, table: Any) -> None:
        table = table if isinstance(table, dict) else {}
        for f in struct.fields:
            value = table.get(f.name)
            if isinstance(f.type, msgspec.inspect.StructType):
                walk(f.type, value)
            elif f.name.endswith("_env"):
                chosen = value if isinstance(value, str) else f.default
                if isinstance(chosen, str) and chosen:
                    names.add(chosen)

    walk(_root(), raw)
    return names


def _secrets(raw: dict[str, Any], environ: Mapping[str, str]) -> set[str]:
    """Variables that hold secrets: those the ``*_env`` fields name, after the environment.

    A ``*_env`` field may be set in the file, by its own variable
    (``CONVEYOR_REDIS__PASSWORD_ENV``) or inside a section's JSON table (``CONVEYOR_REDIS``).
    """
    names = _secret_variables(raw)
    sections = {f.name for f in _root().fields}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if len(path) > 1 and path[-1].endswith("_env"):
            names.add(value)
        elif len(path) == 1 and path[0] in sections:
            try:
                table = msgspec.json.decode(value)
            except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
                continue  # reported when applied, unless it is a secret itself
            names |= _secret_variables({path[0]: table})
    return names


def blame(message: str, source: str, applied: Mapping[str, str]) -> str:
    """Who set what ``message`` is about: the variable (or option) that set its field or
    a section above it, else ``source``. A check across fields (``$.a.b: ...``) also
    names every variable applied, any of which may have taken part."""
    match = _AT_PATH.search(message)
    one_field, across = match.groups() if match else (None, None)
    # An item of a list or table (`$.balancer.queues[1]`, `$.cells.sizes[...]`) was set
    # with its field.
    path = (one_field or across or "").partition("[")[0]
    while path:
        if path in applied:
            return applied[path]
        path = path.rpartition(".")[0] if "." in path else ""
    if applied and one_field is None:
        return f"{source} with {', '.join(sorted(set(applied.values())))}"
    return source


_INT64_MAX = (1 << 63) - 1


def _out_of_range(value: Any, path: str) -> str | None:
    """The first integer of a converted config outside 64 bits, as a validation message:
    no setting needs one, and the brokers (and the C code between) refuse or wrap them."""
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            found = _out_of_range(getattr(value, name), f"{path}.{name}")
            if found:
                return found
    elif isinstance(value, dict):
        for name, item in value.items():
            found = _out_of_range(item, f"{path}.{name}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _out_of_range(item, f"{path}[{i}]")
            if found:
                return found
    elif isinstance(value, int) and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return f"Expected `int` within 64 bits (<= {_INT64_MAX}) - at `{path}`"
    return None


def _fraction(value: Any, t: msgspec.inspect.Type, path: str) -> str | None:
    """The first number of ``value`` written with a fraction or an exponent where type
    ``t`` has a whole number (``total = 8.0``; ``8e0`` from the environment), as a
    validation message: the final conversion is lax (environment values are text) and
    read 8.0 as 8 without a word, while it refused 8.5."""
    if isinstance(t, msgspec.inspect.UnionType):  # `int | None`
        kinds = [k for k in t.types if not isinstance(k, msgspec.inspect.NoneType)]
        t = kinds[0] if len(kinds) == 1 else t
    if isinstance(t, msgspec.inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in t.fields}
        found = (_fraction(v, fields[k], f"{path}.{k}") for k, v in value.items()
                 if k in fields)
    elif isinstance(t, msgspec.inspect.DictType) and isinstance(value, dict):
        found = (_fraction(v, t.value_type, f"{path}.{k}") for k, v in value.items())
    elif isinstance(t, msgspec.inspect.ListType) and isinstance(value, list):
        found = (_fraction(v, t.item_type, f"{path}[{i}]") for i, v in enumerate(value))
    elif isinstance(t, msgspec.inspect.IntType):
        number = value
        if isinstance(value, str):  # environment text, read as JSON reads it
            try:
                number = msgspec.json.decode(value)
            except msgspec.DecodeError:
                return None  # not a number: the conversion says so
        if isinstance(number, float):
            return f"Expected a whole number, got {value} - at `{path}`"
        return None
    else:
        return None
    return next((message for message in found if message), None)


def _convert(raw: dict[str, Any], source: str, applied: Mapping[str, str]) -> Config:
    try:
        fraction = _fraction(raw, _root(), "$")
        if fraction is not None:
            raise ConfigError(fraction)
        config = msgspec.convert(raw, Config, strict=False)
        huge = _out_of_range(config, "$")
        if huge is not None:
            raise ConfigError(huge)
        return config.validate()
    except (msgspec.ValidationError, ConfigError) as exc:
        message = _with_suggestion(str(exc))
        raise ConfigError(f"{blame(message, source, applied)}: {message}") from None
    except RecursionError:
        raise ConfigError(f"{source}: a value is nested too deeply for any config field") from None


_QUOTED_SCALAR = re.compile(r"Expected `(int|float|bool)( \| null)?`, got `str`")


def _refuse_quoted_scalars(raw: dict[str, Any], source: str) -> None:
    """A config file's value in quotes where a number or a boolean belongs is refused,
    naming the field: the final conversion is lax (environment values are text, and
    ``"9"`` must read as 9 there), which read ``tls_verify = "0"`` as false — TLS
    verification off without a word — and ``total = "8"`` as 8."""
    try:
        msgspec.convert(raw, Config, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if _QUOTED_SCALAR.match(message):
            raise ConfigError(f"{source}: {message} (in quotes, a TOML value is text: "
                              "write it without them)") from None
    except (ConfigError, RecursionError):
        pass  # the final conversion says what is wrong, with its suggestions


def require_config(value: object, where: str) -> Config:
    """``value``, refused unless it is a :class:`Config`: a path or a dict given where
    :func:`load_config`'s result goes failed later, as an ``AttributeError`` (or an empty
    dict, being false, stood for the defaults). ``where`` names the call and parameter."""
    if not isinstance(value, Config):
        raise InvalidArgumentError(
            f"{where}: expected a conveyor.Config (from conveyor.load_config(path)), got "
            f"{type(value).__name__} {value!r:.80}")
    return value


def _check_load_arguments(environ: object, overrides: object) -> None:
    """Refuse, naming the argument, an ``environ`` or ``overrides`` of another shape than
    :func:`load_config` reads (they failed deep inside it: ``AttributeError``,
    ``TypeError``)."""
    if environ is not None:
        wrong = _wrong_item(environ, lambda name, value: isinstance(name, str)
                            and isinstance(value, str))
        if wrong is not None:
            raise InvalidArgumentError(
                "load_config: environ: expected a mapping of variable names to values, "
                f"both str (os.environ, or a dict), got {wrong}")
    if overrides is not None:
        wrong = _wrong_item(overrides, lambda name, value: isinstance(value, Mapping))
        if wrong is not None:
            raise InvalidArgumentError(
                "load_config: overrides: expected a mapping of section names to mappings "
                f"of settings ({{'queues': {{'total': 4}}}}), got {wrong}")


def _wrong_item(value: object, fits: Callable[[object, object], bool]) -> str | None:
    """``value`` shown when it is no mapping, or its first item that does not ``fit``;
    None when it is a mapping whose items all do."""
    if not isinstance(value, Mapping):
        return f"{type(value).__name__} {value!r:.80}"
    return next((f"{name!r:.60}: {item!r:.60}" for name, item in value.items()
                 if not fits(name, item)), None)


MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read, 1 MiB: a config is a few kilobytes, and a path to
something endless (``--config /dev/zero``) read until the kernel killed the process."""


def read_config_file(path: str | os.PathLike[str]) -> bytes:
    """A config file's bytes, read once and at most :data:`MAX_CONFIG_BYTES`: a file given
    as ``<(command)`` is a pipe, which a second read finds empty, so a caller that needs
    the text as well as the config reads it here and gives it to :func:`parse_config`."""
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB, which no "
                          "config is (is it the config file?)")
    return text


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Load a config file (or the defaults when ``path`` is None) and apply overrides."""
    _check_load_arguments(environ, overrides)
    if path is None:
        return parse_config(None, "defaults", environ=environ, overrides=overrides)
    if not isinstance(path, str | os.PathLike):  # Path() would raise a bare TypeError
        raise InvalidArgumentError(
            f"load_config: expected the path of a TOML file (str or pathlib.Path) or "
            f"None, got {type(path).__name__} {path!r:.80}")
    if path == "":  # Path("") is the current directory
        raise InvalidArgumentError("load_config: the path is empty: give the path of a "
                                   "TOML file, or None for the defaults")
    return parse_config(read_config_file(path), str(path), environ=environ,
                        overrides=overrides)


def parse_config(
    text: bytes | None,
    source: str,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    applied: dict[str, str] | None = None,
) -> Config:
    """:func:`load_config` of a file's bytes (:func:`read_config_file`; None: no file),
    ``source`` naming it in errors. ``applied`` receives who set which field, as
    :func:`apply_env`'s does, for :func:`blame` to name them in later errors."""
    raw: dict[str, Any] = {}
    if text is not None:
        raw = decode_config_file(text, source)
        _refuse_quoted_scalars(raw, source)
    env = os.environ if environ is None else environ
    applied = {} if applied is None else applied
    raw = apply_env(raw, env, skip=_secrets(raw, env), applied=applied)
    for section, values in (overrides or {}).items():
        _table(raw, section, f"{source}: $.{section}").update(values)
        for name in values:  # a command-line option wins over the variable it replaces
            applied[f"$.{section}.{name}"] = f"a command-line option ({section}.{name})"
    config = _convert(raw, source, applied)
    _refuse_secrets_not_text(config, env)
    return config


def decode_config_file(text: bytes, source: str) -> dict[str, Any]:
    """A config file's bytes (:func:`read_config_file`) as TOML tables, not yet checked
    against :class:`Config`; a ConfigError naming ``source`` when they are no TOML."""
    # "UTF-8 with BOM", as editors on Windows write it: the mark is no TOML statement.
    text = text.removeprefix(b"\xef\xbb\xbf")
    try:  # TOML is UTF-8; checked here, as msgspec's own error differs between versions
        text.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: not valid TOML: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
            f"at offset {exc.start})") from None
    try:
        raw: dict[str, Any] = msgspec.toml.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply for any config field") from None
    return raw


def _refuse_secrets_not_text(config: Config, environ: Mapping[str, str]) -> None:
    """A ConfigError naming the variable (never its value) when one that a ``*_env``
    field names holds bytes that are not UTF-8 (kept by ``os.environ`` as lone
    surrogates, PEP 383): the secret is sent to the broker as UTF-8, and such a password
    was a UnicodeEncodeError traceback at the first Redis command."""
    for section, values in (("redis", config.redis), ("kafka", config.kafka)):
        for field in values.__struct_fields__:
            variable = getattr(values, field)
            if not field.endswith("_env") or not variable:
                continue
            try:
                environ.get(variable, "").encode()
            except UnicodeEncodeError as exc:
                raise ConfigError(
                    f"environment variable {variable} (named by $.{section}.{field}): not "
                    f"UTF-8 text (at character {exc.start + 1})") from None
