"""A `conveyor worker` subprocess exports its traces over OTLP/HTTP to a receiver here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.conftest import free_port, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, str], Span]] = []
        self.paths: list[str] = []


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.paths.append(self.path)
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        received.spans.extend((resource, s) for s in ss.spans)
                payload = ExportTraceServiceResponse().SerializeToString()
            else:
                payload = b""
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()


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
    try:
        wait_until_sync(lambda: out.exists() and len(out.read_text().split()) == 2, 30,
                        what="both jobs handled")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
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
