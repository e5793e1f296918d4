"""docker-compose.yml and docker-compose.cluster.yml cannot be started here (no Docker
engine): check their structure."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from conveyor.platform.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def published_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[0]) for p in service.get("ports", [])}


def test_services_are_kafka_kraft_redis_and_jaeger_with_pinned_images() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "redis", "jaeger"}
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image"
        assert "healthcheck" in service or name == "jaeger"
    kafka = services["kafka"]["environment"]
    assert set(kafka["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in kafka), "KRaft: no ZooKeeper"
    assert "PLAINTEXT://localhost:9092" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "--appendonly" in services["redis"]["command"]


def test_compose_config_points_at_the_published_ports() -> None:
    config = load_config(ROOT / "configs" / "compose.toml", environ={})
    services = compose()["services"]
    redis = urlparse(config.redis.url)
    assert redis.hostname == "localhost" and redis.port in published_ports(services["redis"])
    _host, port = config.kafka.bootstrap.split(":")
    assert int(port) in published_ports(services["kafka"])
    otlp = urlparse(config.telemetry.endpoint)
    assert config.telemetry.exporter == "otlp" and otlp.port in published_ports(
        services["jaeger"]
    )
    assert int(compose()["services"]["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"]) == (
        config.queues.total
    )


def listeners(text: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` to {name: (host, port)}."""
    out = {}
    for item in text.split(","):
        name, _, address = item.strip().partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


def test_kafka_kraft_settings_are_consistent() -> None:
    env = compose()["services"]["kafka"]["environment"]
    node_id = int(env["KAFKA_NODE_ID"])
    voters = [v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")]
    assert [int(voter_id) for voter_id, _ in voters] == [node_id]  # one node votes for itself
    listening = listeners(env["KAFKA_LISTENERS"])
    [controller] = env["KAFKA_CONTROLLER_LISTENER_NAMES"].split(",")
    assert controller in listening
    _, voter_address = voters[0]
    assert int(voter_address.rpartition(":")[2]) == listening[controller][1]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listening) <= set(protocols)  # every listener has a protocol
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert controller not in advertised  # clients never see the controller listener
    for name, (_, port) in advertised.items():
        assert name in listening and listening[name][1] == port
    assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 1  # one broker


def test_the_ports_people_use_are_published_and_jaeger_ingests_otlp() -> None:
    services = compose()["services"]
    assert 9092 in published_ports(services["kafka"])
    assert 6379 in published_ports(services["redis"])
    assert {4318, 16686} <= published_ports(services["jaeger"])  # OTLP HTTP, UI
    for service in services.values():
        for mapping in service.get("ports", []):
            host, _, container = str(mapping).partition(":")
            assert host == container, f"{mapping}: the same port inside and out"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_compose_config_names_the_exact_ports() -> None:
    config = load_config(ROOT / "configs" / "compose.toml", environ={})
    redis = urlparse(config.redis.url)
    assert (redis.hostname, redis.port) == ("localhost", 6379)
    assert config.kafka.bootstrap == "localhost:9092"
    assert config.telemetry.endpoint == "http://localhost:4318"


# docker-compose.cluster.yml: a six-node Redis Cluster and a worker on it.

NODES = [f"redis-{i}" for i in range(6)]
CLUSTER_CONFIG = ROOT / "configs" / "redis-cluster.toml"


def cluster_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())
    return data


def options(command: list[str]) -> dict[str, str]:
    """``redis-server --a x --b y`` to {"--a": "x", "--b": "y"}."""
    assert command[0] == "redis-server" and len(command) % 2 == 1
    return dict(zip(command[1::2], command[2::2], strict=True))


def node_ports() -> dict[str, int]:
    services = cluster_compose()["services"]
    return {name: int(options(services[name]["command"])["--port"]) for name in NODES}


def mount(volume: str) -> tuple[str, str]:
    """``SOURCE:TARGET[:ro]`` to (target, source); SOURCE may hold ``${VAR:-default}``."""
    if volume.endswith((":ro", ":rw")):
        volume = volume[:-3]
    source, _, target = volume.rpartition(":")
    return target, source


def test_the_cluster_is_six_redis_nodes_an_init_job_and_a_worker_with_pinned_images() -> None:
    services = cluster_compose()["services"]
    assert set(services) == {*NODES, "cluster-init", "worker"}
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image"
    assert len({services[name]["image"] for name in [*NODES, "cluster-init"]}) == 1
    assert services["redis-0"]["image"].startswith("redis:7")  # CLUSTER SHARDS, cluster-port


def test_every_node_runs_the_same_cluster_options_on_a_port_of_its_own() -> None:
    services = cluster_compose()["services"]
    ports = node_ports()
    assert len(set(ports.values())) == len(NODES)
    shared = []
    for name in NODES:
        node = options(services[name]["command"])
        assert node["--cluster-enabled"] == "yes" and node["--appendonly"] == "yes"
        assert node["--cluster-announce-ip"] == "127.0.0.1"  # see the namespace test
        assert services[name]["healthcheck"]["test"] == [
            "CMD", "redis-cli", "-p", str(ports[name]), "ping"]
        [volume] = services[name]["volumes"]
        assert volume == f"{name}:/data" and name in cluster_compose()["volumes"]
        del node["--port"]
        shared.append(node)
    assert all(node == shared[0] for node in shared), "nodes differ in more than the port"


def test_the_nodes_share_one_network_namespace_that_publishes_every_node_port() -> None:
    """The nodes announce 127.0.0.1:PORT: that is the node itself for everything in
    redis-0's namespace, and the published port for clients on the host."""
    services = cluster_compose()["services"]
    for name, service in services.items():
        if name != "redis-0":
            assert service["network_mode"] == "service:redis-0", name
            assert "ports" not in service, f"{name}: publish on redis-0, which owns the ports"
    published = services["redis-0"]["ports"]
    assert sorted(published) == sorted(f"{p}:{p}" for p in node_ports().values())
    bus_ports = {p + 10000 for p in node_ports().values()}  # cluster bus: port + 10000
    assert not bus_ports & set(node_ports().values())
    assert not bus_ports & published_ports(services["redis-0"]), "the bus stays inside"


def test_the_init_job_creates_the_cluster_from_every_node_once_all_are_healthy() -> None:
    services = cluster_compose()["services"]
    init = services["cluster-init"]
    assert init["depends_on"] == {name: {"condition": "service_healthy"} for name in NODES}
    assert init["restart"] == "no"
    script = init["command"][-1].split()
    [create] = [i for i in range(len(script))
                if script[i:i + 3] == ["redis-cli", "--cluster", "create"]]
    addresses = [a for a in script[create + 3:] if a.startswith("127.0.0.1:")]
    assert addresses == [f"127.0.0.1:{p}" for p in node_ports().values()]
    replicas = int(script[script.index("--cluster-replicas") + 1])
    assert len(NODES) // (1 + replicas) == 3  # three primaries, each with a replica
    assert "--cluster-yes" in script
    assert "cluster_known_nodes:6" in init["command"][-1], "a restart must not re-create"
    assert "cluster_state:ok" in init["command"][-1], "done only when the cluster serves"


def test_the_worker_starts_on_the_cluster_config_after_the_init_job() -> None:
    worker = cluster_compose()["services"]["worker"]
    assert worker["depends_on"] == {
        "cluster-init": {"condition": "service_completed_successfully"}}
    assert worker["build"] == "." and (ROOT / "Dockerfile").exists()
    command = worker["command"]
    assert command[0] == "worker"  # the image's entrypoint is `conveyor`
    config_in_container = command[command.index("--config") + 1]
    mounts = dict(mount(volume) for volume in worker["volumes"])
    assert mounts[config_in_container] == "./configs/redis-cluster.toml"
    assert "/app" in mounts  # the image's WORKDIR and PYTHONPATH: the user's app


@pytest.mark.skipif(not CLUSTER_CONFIG.exists(),
                    reason="configs/redis-cluster.toml comes with the cluster adapter")
def test_the_cluster_config_seeds_from_a_node_the_compose_file_publishes() -> None:
    redis_section = tomllib.loads(CLUSTER_CONFIG.read_text())["redis"]
    assert redis_section["mode"] == "cluster"
    url = urlparse(redis_section["url"])
    assert url.hostname in ("127.0.0.1", "localhost")
    assert url.port in node_ports().values()
