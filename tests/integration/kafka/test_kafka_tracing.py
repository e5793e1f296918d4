"""One trace across processes on the Kafka-protocol broker (tansu): Client here
(in-memory exporter), worker there (OTLP to a local receiver decoding the protobuf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import load_config
from tests.integration.kafka.conftest import Tansu
from tests.otlp import (
    Receiver,
    assert_dead_letters,
    assert_exported_counts,
    assert_one_trace_per_message,
    otlp_receiver,
    run_traced_worker,
)

__all__ = ["otlp_receiver"]
pytestmark = [pytest.mark.kafka]


def test_a_message_published_here_and_handled_by_a_worker_process_is_one_trace(
    tansu: Tansu, topic: str, otlp_receiver: tuple[str, Receiver], tmp_path: Path
) -> None:
    endpoint, received = otlp_receiver
    cfg_path = tmp_path / "kafka.toml"
    cfg_path.write_text(f"""
[queues]
adapter = "kafka"
total = 2

[kafka]
bootstrap = "{tansu.bootstrap}"
topic = "{topic}"

[balancer]
kind = "static"

[worker]
poll_timeout_ms = 200
""")
    producers, dead_letters = run_traced_worker(
        cfg_path, load_config(cfg_path, environ={}), endpoint, received,
        tmp_path / "handled.txt", "traced-kafka",
    )
    assert_one_trace_per_message(producers, received, "kafka", "traced-kafka")
    assert_dead_letters(dead_letters)
    assert_exported_counts(received)
