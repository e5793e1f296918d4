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
