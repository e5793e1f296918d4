"""A `conveyor worker` subprocess exports its traces over OTLP/HTTP to a receiver here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.conftest import stop_when
from tests.otlp import Receiver, otlp_receiver

__all__ = ["otlp_receiver"]  # the fixture, used by name below

ROOT = Path(__file__).resolve().parents[2]


def test_worker_subprocess_exports_one_trace_per_message_over_otlp(
    tmp_path: Path, otlp_receiver: tuple[str, Receiver]
) -> None:
    endpoint, received = otlp_receiver
    out = tmp_path / "handled.txt"
    env = {
        **os.environ,
        "CONVEYOR_TEST_OUT": str(out),
        "CONVEYOR_TELEMETRY__EXPORTER": "otlp",
        "CONVEYOR_TELEMETRY__ENDPOINT": endpoint,
        "CONVEYOR_TELEMETRY__SERVICE_NAME": "traced-worker",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.traced_app:app"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stop_when(proc, lambda: out.exists() and len(out.read_text().split()) == 2, 30,
              "both jobs handled")
    assert "/v1/traces" in received.paths
    spans = [s for _, s in received.spans]
    assert {r["service.name"] for r, _ in received.spans} == {"traced-worker"}
    producers = [s for s in spans if s.kind == Span.SPAN_KIND_PRODUCER]
    assert len(producers) == 2
    for producer in producers:
        in_trace = [s for s in spans if s.trace_id == producer.trace_id]
        [consumer] = [s for s in in_trace if s.kind == Span.SPAN_KIND_CONSUMER]
        assert consumer.parent_span_id == producer.span_id
        retries = [s for s in in_trace if s.name.startswith("retry ")
                   and s.parent_span_id == consumer.span_id]
        key = {a.key: a.value.string_value for a in producer.attributes}["conveyor.stream.key"]
        assert len(retries) == (0 if key == "a" else 1)  # "b" failed once, then succeeded
