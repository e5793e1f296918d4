"""A broker that refuses the login: one line saying "authentication failed", no traceback.

The broker is tansu with ``--authentication`` and no users, so every SCRAM login is
refused; aiokafka reports that as ``KeyError: 'v'`` from its SCRAM code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.platform.config import load_config
from conveyor.platform.errors import BrokerConnectionError, BrokerError
from tests.integration.kafka.conftest import Tansu, start_tansu

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "wr0ng-Pa55word"


@pytest.fixture(scope="module")
def tansu_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    broker = start_tansu(tmp_path_factory.mktemp("tansu-auth"), "--authentication")
    yield broker
    broker.stop()


def sasl_toml(bootstrap: str, topic: str) -> str:
    return (f'[queues]\nadapter = "kafka"\ntotal = 2\n'
            f'[kafka]\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\n'
            'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "SCRAM-SHA-256"\n'
            'sasl_username = "alice"\n[balancer]\nkind = "kafka-group"\n')


async def test_a_refused_login_is_a_broker_error_saying_so(
    tansu_auth: Tansu, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_KAFKA_PASSWORD", PASSWORD)
    path = tmp_path / "sasl.toml"
    path.write_text(sasl_toml(tansu_auth.bootstrap, topic))
    config = load_config(path, environ={})
    adapter = KafkaAdapter(config.kafka, config.queues.total)
    try:
        with pytest.raises(BrokerError, match="authentication failed") as caught:
            await adapter.ensure_topic()
    finally:
        await adapter.close()
    assert not isinstance(caught.value, BrokerConnectionError), "not an outage to wait out"
    assert PASSWORD not in str(caught.value)


def test_a_worker_refused_by_the_broker_stops_with_one_line(
    tansu_auth: Tansu, topic: str, tmp_path: Path
) -> None:
    path = tmp_path / "sasl.toml"
    path.write_text(sasl_toml(tansu_auth.bootstrap, topic))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "conveyor"), "worker", "tests/apps/drain_app.py:app",
         "--config", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**env, "CONVEYOR_KAFKA_PASSWORD": PASSWORD, "CONVEYOR_TEST_MESSAGES": "0"},
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and PASSWORD not in result.stderr
    failed = [line for line in result.stderr.splitlines() if "authentication failed" in line]
    assert len(failed) == 1 and failed[0].startswith("conveyor: error: kafka: "), result.stderr
