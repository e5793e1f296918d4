"""docker-compose.yml cannot be started here (no Docker engine): check its structure."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

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
