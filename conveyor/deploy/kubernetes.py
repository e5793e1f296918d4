"""Kubernetes manifests for one app, rendered from its config so that names cannot drift.

:func:`render` returns the objects ``conveyor deploy kubernetes`` prints, in apply order:

1. a ``ConfigMap`` holding the config file byte for byte (mounted at
   :data:`CONFIG_DIR`), so the pods run the very file the names below were read from;
2. a ``Deployment`` of worker pods (no ``replicas``: KEDA owns the count):
   ``conveyor worker APP_PATH --config … --http-port P``, liveness on ``/healthz``,
   readiness on ``/readyz``, ``envFrom`` an optional Secret (credentials, as
   ``CONVEYOR_*`` and the variables the ``*_env`` fields name), and
   ``terminationGracePeriodSeconds`` above the drain (:func:`grace_period_s`);
3. for Kafka with SASL, a KEDA ``TriggerAuthentication`` reading the same credentials
   from the worker container's environment;
4. a KEDA ``ScaledObject`` on the broker's own lag: Kafka — one ``kafka`` trigger (the
   app's consumer group on the topic); Redis — per queue stream a ``redis-streams``
   trigger on the group's lag (undelivered) and one on its pending entries (delivered,
   unacknowledged), summed by a ``scalingModifiers`` formula (docs/kubernetes.md says
   why).

The config is read from the file alone (no ``CONVEYOR_*`` environment of the machine
that renders), since that file is what the pods get; the Secret should hold credentials
only. A config whose daemons cannot share work across pods is refused
(:func:`check_spans_pods`) with a :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.connection import parse_url

from conveyor.adapters.redis.keys import Keys
from conveyor.adapters.redis.urls import sentinel_addresses
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, InvalidArgumentError
from conveyor.workers.serve import STOP_GRACE_S

CONFIG_DIR = "/etc/conveyor"
CONFIG_FILE = "conveyor.toml"
APP_DIR = "/app"
"""Where the image keeps the app (its ``WORKDIR``, on ``PYTHONPATH``): see the Dockerfile."""
RUN_AS_USER = 10001
"""The image's non-root user (numeric, so ``runAsNonRoot`` can check it)."""
CONTAINER = "worker"
GRACE_MARGIN_S = 5
"""Beyond drain + stop grace: interpreter exit, and a signal that arrives a little late."""
MAX_REDIS_QUEUES = 128
"""Two triggers a queue stream: past this the ScaledObject grows past what is sensible
to store in etcd and poll every interval (see docs/kubernetes.md)."""
KEDA_API = "keda.sh/v1alpha1"

_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class Options:
    """What the command line adds to the config."""

    app_path: str
    """``MODULE:ATTR`` or ``FILE.py:ATTR`` as the container sees it (relative to /app)."""
    app_name: str
    """The App's name: its consumer group on every adapter."""
    config_text: str
    """The config file, put in the ConfigMap unchanged."""
    image: str
    replicas: int = 1
    """The ScaledObject's ``minReplicaCount`` (0: scale to zero when there is no lag).
    The Deployment carries no ``replicas``: the count is KEDA's, and a re-apply would
    otherwise reset it, draining pods KEDA had added."""
    max_replicas: int | None = None
    """Default: ``[queues] total`` (a pod past it would own no queue)."""
    namespace: str | None = None
    http_port: int = 9464
    cpu: str = "500m"
    memory: str = "512Mi"


def object_name(app_name: str) -> str:
    """A DNS-1123 label made of the app's name (Kubernetes names allow no ``_`` or ``.``)."""
    name = _DNS_LABEL.sub("-", app_name.lower()).strip("-")[:50].strip("-")
    if not name:
        raise InvalidArgumentError(
            f"app name {app_name!r} has no letter or digit to name Kubernetes objects after"
        )
    return name


def grace_period_s(config: Config) -> int:
    """``terminationGracePeriodSeconds``: the drain, the stop's own grace after it
    (:data:`~conveyor.workers.serve.STOP_GRACE_S`), and :data:`GRACE_MARGIN_S`, so that
    Kubernetes' SIGKILL never cuts a drain the config allows."""
    return math.ceil(config.worker.drain_timeout_s + STOP_GRACE_S) + GRACE_MARGIN_S


def check_spans_pods(config: Config) -> None:
    """Refuse configs whose daemons cannot share the queues among pods (ConfigError)."""
    adapter, balancer = config.queues.adapter, config.balancer
    if adapter == "memory":
        raise ConfigError(
            '$.queues.adapter: the embedded "memory" adapter lives inside one process and '
            "cannot span pods; deploy with a redis or kafka config (configs/redis.toml, "
            "configs/kafka.toml)"
        )
    if balancer.kind == "static":
        raise ConfigError(
            '$.balancer.kind: "static" makes every pod own the same queues (each would '
            'run every message); use "dynamic" with membership = "redis"'
            + (' or "kafka-group"' if adapter == "kafka" else "")
        )
    if balancer.kind == "dynamic" and balancer.membership != "redis":
        raise ConfigError(
            '$.balancer.membership: "memory" only shares queues among the daemons of one '
            'process, so every pod would own every queue; use membership = "redis"'
            + (' or balancer kind = "kafka-group"' if adapter == "kafka" else "")
        )


def check_app_path(app_path: str) -> None:
    """The container resolves APP_PATH under /app: a path outside it cannot be there."""
    module = app_path.partition(":")[0]
    if module.endswith(".py"):
        path = PurePosixPath(module)
        if path.is_absolute() or ".." in path.parts:
            raise InvalidArgumentError(
                f"APP_PATH {app_path!r} names a file outside the image's {APP_DIR}; give "
                f"it as the container sees it, relative to {APP_DIR} (e.g. shop.py:app) "
                f"or as MODULE:ATTR"
            )


def render(config: Config, options: Options) -> list[dict[str, Any]]:
    """The manifests for ``config`` and ``options``, in apply order (see the module doc)."""
    check_spans_pods(config)
    check_app_path(options.app_path)
    total = config.queues.total
    max_replicas = total if options.max_replicas is None else options.max_replicas
    if max_replicas > total:
        raise InvalidArgumentError(
            f"--max-replicas {max_replicas} exceeds [queues] total = {total}: a pod past "
            f"{total} would own no queue"
        )
    if options.replicas > max_replicas:
        raise InvalidArgumentError(
            f"--replicas {options.replicas} exceeds the most replicas, {max_replicas}"
        )
    name = object_name(options.app_name)
    objects = [config_map(name, options), deployment(name, config, options)]
    auth = trigger_authentication(name, config, options)
    if auth is not None:
        objects.append(auth)
    objects.append(scaled_object(name, config, options, max_replicas,
                                 auth_name=auth["metadata"]["name"] if auth else None))
    return objects


def _metadata(name: str, options: Options) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if options.namespace:
        meta["namespace"] = options.namespace
    meta["labels"] = _labels(options)
    return meta


def _labels(options: Options) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "conveyor-worker",
        "app.kubernetes.io/instance": object_name(options.app_name),
        "app.kubernetes.io/managed-by": "conveyor-deploy",
    }


def config_map(name: str, options: Options) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(f"{name}-config", options),
        "data": {CONFIG_FILE: options.config_text},
    }


def secret_name(name: str) -> str:
    """The Secret the pods take their environment from (created by the user; optional)."""
    return f"{name}-secrets"


def deployment(name: str, config: Config, options: Options) -> dict[str, Any]:
    port = options.http_port
    selector = {"app.kubernetes.io/name": "conveyor-worker",
                "app.kubernetes.io/instance": name}

    def probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
                "timeoutSeconds": 2, "failureThreshold": failures}

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": options.image,
        "args": ["worker", options.app_path, "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                 "--http-port", str(port)],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "envFrom": [{"secretRef": {"name": secret_name(name), "optional": True}}],
        "env": _plain_env(config),
        # /healthz answers once the event loop runs; the start may wait on the broker.
        "startupProbe": probe("/healthz", 2, 30),
        "livenessProbe": probe("/healthz", 10, 3),
        "readinessProbe": probe("/readyz", 5, 2),
        "resources": {
            "requests": {"cpu": options.cpu, "memory": options.memory},
            "limits": {"memory": options.memory},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if not container["env"]:
        del container["env"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(f"{name}-worker", options),
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": _labels(options),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": grace_period_s(config),
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": f"{name}-config"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


KAFKA_USERNAME_ENV = "CONVEYOR_KAFKA__SASL_USERNAME"
"""Set in the pod to the config's own ``sasl_username`` (no change for the worker), so
that KEDA's TriggerAuthentication can read it from the container like the password."""


def _plain_env(config: Config) -> list[dict[str, str]]:
    if config.queues.adapter == "kafka" and _kafka_sasl(config) is not None:
        return [{"name": KAFKA_USERNAME_ENV, "value": config.kafka.sasl_username}]
    return []


KEDA_SASL = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256",
             "SCRAM-SHA-512": "scram_sha512"}
"""``[kafka] sasl_mechanism`` to the kafka trigger's ``sasl`` value."""


def _kafka_sasl(config: Config) -> str | None:
    """KEDA's ``sasl`` value for the config's mechanism, or None without SASL."""
    if not config.kafka.security_protocol.startswith("SASL_"):
        return None
    return KEDA_SASL[config.kafka.sasl_mechanism]


def trigger_authentication(name: str, config: Config,
                           options: Options) -> dict[str, Any] | None:
    """Kafka with SASL: KEDA reads username and password from the worker's environment
    (the password from the Secret, as the worker does). Redis needs none: its trigger
    names the variables itself (``usernameFromEnv`` / ``passwordFromEnv``)."""
    if config.queues.adapter != "kafka" or _kafka_sasl(config) is None:
        return None
    env = [
        {"parameter": "username", "name": KAFKA_USERNAME_ENV, "containerName": CONTAINER},
        {"parameter": "password", "name": config.kafka.sasl_password_env,
         "containerName": CONTAINER},
    ]
    return {
        "apiVersion": KEDA_API,
        "kind": "TriggerAuthentication",
        "metadata": _metadata(f"{name}-keda-auth", options),
        "spec": {"env": env},
    }


def scaled_object(name: str, config: Config, options: Options, max_replicas: int,
                  *, auth_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                           "name": f"{name}-worker"},
        "minReplicaCount": options.replicas,
        "maxReplicaCount": max_replicas,
        "pollingInterval": 15,
        # Scale-downs drain a pod: keep a replica a while before taking it away.
        "cooldownPeriod": 300,
    }
    if config.queues.adapter == "kafka":
        spec["triggers"] = [kafka_trigger(config, options.app_name, auth_name)]
    else:
        triggers = redis_triggers(config, options.app_name)
        spec["triggers"] = triggers
        spec["advanced"] = {"scalingModifiers": {
            "formula": " + ".join(t["name"] for t in triggers),
            "target": str(lag_per_replica(config)),
            "activationTarget": "0",
            "metricType": "AverageValue",
        }}
    return {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": _metadata(f"{name}-worker", options),
        "spec": spec,
    }


def lag_per_replica(config: Config) -> int:
    """The target lag per pod: ``[supervisor] lag_per_process``, the same figure
    ``conveyor worker --processes`` scales processes on."""
    return config.supervisor.lag_per_process


def kafka_trigger(config: Config, group: str, auth_name: str | None) -> dict[str, Any]:
    """The app's consumer group (its committed offsets) on the app's topic."""
    kafka = config.kafka
    metadata = {
        "bootstrapServers": kafka.bootstrap,
        "consumerGroup": group,
        "topic": kafka.topic,
        "lagThreshold": str(lag_per_replica(config)),
        # The adapter starts a new group at the earliest offset (auto_offset_reset).
        "offsetResetPolicy": "earliest",
    }
    sasl = _kafka_sasl(config)
    if sasl is not None:
        metadata["sasl"] = sasl
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        metadata["tls"] = "enable"
    trigger: dict[str, Any] = {"type": "kafka", "metadata": metadata}
    if auth_name is not None:
        trigger["authenticationRef"] = {"name": auth_name}
    return trigger


@dataclass(frozen=True, slots=True)
class RedisServer:
    address: str
    """``host:port``."""
    database: int
    tls: bool
    has_password: bool


def redis_server(url: str) -> RedisServer:
    """Where KEDA finds the server, from ``[redis] url`` (already checked by the config),
    read by redis-py's own parser as the adapter's client reads it (``?db=`` too)."""
    parsed = parse_url(url)
    host = str(parsed.get("host", "localhost"))
    host = f"[{host}]" if ":" in host else host
    return RedisServer(
        address=f"{host}:{parsed.get('port', 6379)}",
        database=int(parsed.get("db", 0)),
        tls=urlsplit(url).scheme == "rediss",
        has_password=parsed.get("password") is not None,
    )


def redis_triggers(config: Config, group: str) -> list[dict[str, Any]]:
    """Per queue stream: the group's lag (``lagCount``, Redis 7+) and its pending
    entries (``pendingEntriesCount``); their sum is the app's unfinished work, what
    ``conveyor status`` calls lag."""
    total = config.queues.total
    if total > MAX_REDIS_QUEUES:
        raise ConfigError(
            f"$.queues.total: {total} queues would take {2 * total} redis-streams "
            f"triggers; the ScaledObject supports at most {MAX_REDIS_QUEUES} queues "
            f"(see docs/kubernetes.md for scaling on a Prometheus lag metric instead)"
        )
    redis = config.redis
    server = redis_server(redis.url)
    cluster = redis.mode == "cluster"
    keys = Keys(redis.prefix, cluster=cluster)
    # KEDA's redis-cluster-streams scaler discovers the other nodes from the one named;
    # its redis-sentinel-streams scaler asks the sentinels for the primary, as we do.
    kind = {"cluster": "redis-cluster-streams",
            "sentinel": "redis-sentinel-streams"}.get(redis.mode, "redis-streams")
    common = {"consumerGroup": group}
    if cluster:
        common["addresses"] = server.address
    elif redis.mode == "sentinel":
        common.update(addresses=",".join(redis.sentinels), sentinelMaster=redis.sentinel_service,
                      databaseIndex=str(server.database))
        for key, env in (("sentinelUsernameFromEnv", redis.sentinel_username_env),
                         ("sentinelPasswordFromEnv", redis.sentinel_password_env)):
            if env:
                common[key] = env
    else:
        common.update(address=server.address, databaseIndex=str(server.database))
    if server.tls:
        common["enableTLS"] = "true"
    if redis.username_env:
        common["usernameFromEnv"] = redis.username_env
    if redis.password_env:
        common["passwordFromEnv"] = redis.password_env
    target = str(lag_per_replica(config))
    triggers = []
    for queue in range(total):
        stream = {**common, "stream": keys.queue(queue)}
        triggers.append({"type": kind, "name": f"q{queue}_lag",
                         "metadata": {**stream, "lagCount": target}})
        triggers.append({"type": kind, "name": f"q{queue}_pending",
                         "metadata": {**stream, "pendingEntriesCount": target}})
    return triggers


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})


def warnings(config: Config) -> list[str]:
    """What renders but is probably not what a cluster wants (printed, not refused)."""
    found = []
    if config.queues.adapter == "redis":
        server = redis_server(config.redis.url)
        field, hosts = "url", [server.address.rpartition(":")[0]]
        if config.redis.mode == "sentinel":  # the url's host is not used
            field = "sentinels"
            hosts = [f"[{h}]" if ":" in h else h
                     for h, _ in sentinel_addresses(config.redis.sentinels)]
        loopback = [h for h in hosts if h in _LOOPBACK]
        if loopback:
            found.append(f"$.redis.{field} points at {loopback[0]}: inside a pod that is the "
                         "pod itself")
        if server.has_password:
            found.append("$.redis.url holds a password, which lands in the ConfigMap; put it "
                         f"in the Secret as {config.redis.password_env or 'the password_env'}")
    if config.queues.adapter == "kafka":
        hosts = [h.rpartition(":")[0] for h in config.kafka.bootstrap.split(",")]
        loopback = [h for h in hosts if h in _LOOPBACK]
        if loopback:
            found.append(f"$.kafka.bootstrap points at {loopback[0]}: inside a pod that is "
                         "the pod itself")
    files = {"$.redis.tls_ca_file": config.redis.tls_ca_file,
             "$.redis.tls_cert_file": config.redis.tls_cert_file,
             "$.redis.tls_key_file": config.redis.tls_key_file,
             "$.kafka.ssl_cafile": config.kafka.ssl_cafile,
             "$.kafka.ssl_certfile": config.kafka.ssl_certfile,
             "$.kafka.ssl_keyfile": config.kafka.ssl_keyfile}
    adapter = config.queues.adapter
    for field, path in files.items():
        if path and field.startswith(f"$.{adapter}."):
            found.append(f"{field} names {path}, which the pods must have: mount it there "
                         "(e.g. from a Secret volume) in the Deployment")
    return found
