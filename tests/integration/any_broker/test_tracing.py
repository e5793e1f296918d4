"""One trace across processes: Client here (in-memory exporter), worker there (OTLP to a
local receiver decoding the protobuf), on each broker."""

from __future__ import annotations

from pathlib import Path

from conveyor import load_config
from tests.integration.any_broker.conftest import Broker
from tests.otlp import (
    Receiver,
    assert_dead_letters,
    assert_exported_counts,
    assert_one_trace_per_message,
    otlp_receiver,
    run_traced_worker,
)

__all__ = ["otlp_receiver"]


def test_a_message_published_here_and_handled_by_a_worker_process_is_one_trace(
    broker: Broker, otlp_receiver: tuple[str, Receiver], tmp_path: Path
) -> None:
    endpoint, received = otlp_receiver
    app = f"traced-{broker.name}"
    cfg_path = broker.config_file(tmp_path / "c.toml")
    producers, dead_letters = run_traced_worker(
        cfg_path, load_config(cfg_path, environ={}), endpoint, received,
        tmp_path / "handled.txt", app,
    )
    assert_one_trace_per_message(producers, received, broker.name, app)
    assert_dead_letters(dead_letters)
    assert_exported_counts(received)
    # Each daemon's telemetry names its process: the member id is the instance id.
    [instance] = {r.get("service.instance.id") for r, _ in received.spans}
    assert isinstance(instance, str) and instance.startswith(f"{app}-")
