"""The same scenario on each real broker: ``broker`` is parametrized (ids ``redis``,
``kafka``) the way tests/contract/'s ``adapter`` is, one level up — worker processes and
in-process daemons rather than the port. A scenario belongs here when its steps and its
assertions are the same on both and only the server differs; what one broker does of
its own stays in tests/integration/redis/ or kafka/.

Each test gets a redis-server of its own, or a fresh topic on the module's tansu broker.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.platform.config import Config, load_config
from tests.config_files import write_toml
from tests.integration.redis.conftest import REPO


@dataclass(frozen=True)
class Broker:
    """One test's server, and config files pointing at it."""

    name: str
    """``redis`` or ``kafka``: the adapter, and the test's id."""
    base: dict[str, dict[str, object]]
    """The sections of a config file for this server (a worker config of the tests)."""
    env: dict[str, str]
    """What points the shipped ``configs/<name>.toml`` at this server."""

    @property
    def shipped(self) -> Path:
        return REPO / "configs" / f"{self.name}.toml"

    def config_file(self, path: Path, **sections: dict[str, object]) -> Path:
        """The base config with ``sections`` laid over it, written at ``path``."""
        return write_toml(path, self.base, **sections)

    def config(self, tmp_path: Path, **sections: dict[str, object]) -> Config:
        return load_config(self.config_file(tmp_path / f"{self.name}.toml", **sections),
                           environ={})


def _redis(request: pytest.FixtureRequest) -> Broker:
    url = request.getfixturevalue("redis_server").url
    return Broker("redis", {
        "queues": {"adapter": "redis", "total": 8},
        "redis": {"url": url, "prefix": "t"},
        "balancer": {"kind": "dynamic", "membership": "redis"},
    }, {"CONVEYOR_REDIS__URL": url})


def _kafka(request: pytest.FixtureRequest) -> Broker:
    bootstrap = request.getfixturevalue("tansu").bootstrap
    topic = f"t-{uuid.uuid4().hex[:10]}"
    return Broker("kafka", {
        "queues": {"adapter": "kafka", "total": 2},
        "kafka": {"bootstrap": bootstrap, "topic": topic},
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 200},
    }, {"CONVEYOR_KAFKA__BOOTSTRAP": bootstrap, "CONVEYOR_KAFKA__TOPIC": topic})


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("kafka", marks=pytest.mark.kafka)])
def broker(request: pytest.FixtureRequest) -> Broker:
    return _redis(request) if request.param == "redis" else _kafka(request)
