"""A local OTLP/HTTP receiver that decodes exports with opentelemetry-proto, and the
one-trace-across-processes scenario the Redis and Kafka tracing tests share."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor import Client
from conveyor.backends import create_adapter
from conveyor.platform.config import Config
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import DeadLetter
from conveyor.platform.telemetry import Telemetry
from tests.conftest import free_port, stop_when

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Receiver:
    spans: list[tuple[dict[str, str], Span]] = field(default_factory=list)
    metrics: list[tuple[dict[str, str], Metric]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def metric_points(self, name: str) -> list[Any]:
        """Every data point received for metric ``name`` (gauge or sum), oldest first."""
        points: list[Any] = []
        for _, m in self.metrics:
            if m.name == name:
                points.extend(getattr(m, m.WhichOneof("data")).data_points)
        return points


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def attributes(items: Any) -> dict[str, Any]:
    """Protobuf ``KeyValue`` list to a dict (strings, ints, ...)."""
    kvs: list[KeyValue] = list(items)
    return {a.key: _value(a.value) for a in kvs}


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.paths.append(self.path)
            received.headers.append({k.lower(): v for k, v in self.headers.items()})
            payload = b""
            if self.path == "/v1/traces":
                traces = ExportTraceServiceRequest.FromString(body)
                for rs in traces.resource_spans:
                    resource = attributes(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        received.spans.extend((resource, s) for s in ss.spans)
                payload = ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                metrics = ExportMetricsServiceRequest.FromString(body)
                for rm in metrics.resource_metrics:
                    resource = attributes(rm.resource.attributes)
                    for sm in rm.scope_metrics:
                        received.metrics.extend((resource, m) for m in sm.metrics)
                payload = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            """Quiet: the test reads the decoded spans, not an access log."""

    server = HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()


# -- one trace across processes --------------------------------------------------------
# (key, body, retry attempts expected, dead-lettered?) for tests.apps.traced_handler.
JOBS: list[tuple[str, dict[str, int], list[int], bool]] = [
    ("k1", {"seq": 1}, [], False),
    ("k2", {"seq": 2, "fail": 1}, [2], False),  # fails once, succeeds on attempt 2
    ("k3", {"seq": 3, "fail": -1}, [2, 3], True),  # fails three times: dead-lettered
]
UNROUTABLE = ("nobody", "k4", {"seq": 4})  # no handler subscribes: dead-lettered at once


def _id(b: bytes) -> int:
    return int.from_bytes(b, "big")


def run_traced_worker(
    config_path: Path, config: Config, endpoint: str, received: Receiver, out: Path,
    app_name: str,
) -> tuple[list[ReadableSpan], list[DeadLetter]]:
    """Publish :data:`JOBS` and :data:`UNROUTABLE` here (in-memory exporter) to a
    ``conveyor worker`` subprocess running tests.apps.traced_handler (OTLP to
    ``endpoint``); return the producer spans and the dead letters once every message
    is finished and the worker has exited cleanly (spans flushed)."""
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_APP": app_name,
           "CONVEYOR_TELEMETRY__EXPORTER": "otlp", "CONVEYOR_TELEMETRY__ENDPOINT": endpoint,
           "CONVEYOR_TELEMETRY__METRICS_INTERVAL_S": "0.5", "OTEL_BSP_SCHEDULE_DELAY": "100",
           # the unroutable message is this app's to keep: its dead letter is traced too
           "CONVEYOR_DEAD_LETTERS__UNROUTABLE": "dead-letter"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.traced_handler:app",
         "--config", str(config_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))

    def client() -> Client:
        adapter = create_adapter(config.queues.adapter, config)
        return Client(adapter, HashRingQueueMapper(config.queues.total),
                      telemetry=Telemetry(provider), owns_adapter=True)

    async def publish() -> None:
        async with client() as c:
            for key, body, _, _ in JOBS:
                await c.publish("jobs", key, body)
            await c.publish(*UNROUTABLE)

    async def dead_letters() -> list[DeadLetter]:
        async with client() as c:
            return await c.adapter.dead_letters.read(app_name)

    def finished() -> bool:
        names = [s.name for _, s in received.spans]
        return (out.exists() and sorted(out.read_text().split()) == ["1", "2"]
                and names.count("dead-letter") == 2)

    try:
        asyncio.run(publish())
    except BaseException:
        proc.kill()  # the worker must not outlive a failed publish
        proc.wait()
        raise
    stop_when(proc, finished, 60, "two handled, two dead-letter spans exported")
    assert sorted(out.read_text().split()) == ["1", "2"]  # exactly once each here
    return list(spans.get_finished_spans()), asyncio.run(dead_letters())


def assert_one_trace_per_message(
    producers: list[ReadableSpan], received: Receiver, system: str, group: str
) -> None:
    """Each producer span here roots one trace: consumer → retry/dead-letter spans there."""
    assert len(producers) == len(JOBS) + 1
    remote = [s for _, s in received.spans]
    for producer in producers:
        assert producer.attributes is not None
        assert producer.attributes["messaging.system"] == system
        assert producer.attributes["messaging.operation.name"] == "publish"
        in_trace = [s for s in remote if _id(s.trace_id) == producer.context.trace_id]
        key = producer.attributes["conveyor.stream.key"]
        if key == UNROUTABLE[1]:
            [dead] = in_trace
            assert dead.name == "dead-letter"
            assert _id(dead.parent_span_id) == producer.context.span_id
            assert attributes(dead.attributes)["error.type"] == "Unroutable"
            continue
        [(_, _, retries, dead_lettered)] = [j for j in JOBS if j[0] == key]
        [consumer] = [s for s in in_trace if s.kind == Span.SPAN_KIND_CONSUMER]
        assert _id(consumer.parent_span_id) == producer.context.span_id
        attrs = attributes(consumer.attributes)
        assert attrs["messaging.system"] == system
        assert attrs["messaging.consumer.group.name"] == group
        assert attrs["messaging.message.id"] == producer.attributes["messaging.message.id"]
        assert attrs["messaging.operation.name"] == "process"
        children = [s for s in in_trace if s is not consumer]
        assert all(s.parent_span_id == consumer.span_id for s in children)
        attempts = [attributes(s.attributes)["conveyor.attempt"] for s in children
                    if s.name.startswith("retry ")]
        assert sorted(attempts) == retries
        dead = [s for s in children if s.name == "dead-letter"]
        assert len(dead) == int(dead_lettered)
        assert len(children) == len(retries) + len(dead)
        failed = consumer.status.code == Status.STATUS_CODE_ERROR
        assert failed == dead_lettered


def assert_exported_counts(received: Receiver) -> None:
    """The worker's last metric export counts exactly the :data:`JOBS` workload."""
    def last(name: str) -> int:
        points = received.metric_points(name)
        assert points, f"no {name} exported"
        return int(points[-1].as_int)

    assert last("conveyor.messages.handled") == 2
    assert last("conveyor.messages.dead_lettered") == 2  # k3 and the unroutable one
    assert last("conveyor.messages.retried") == 1 + 2
    assert last("conveyor.messages.failed") == 1 + 3
    instances = {r.get("service.instance.id") for r, _ in received.spans + received.metrics}
    assert len(instances) == 1  # traces and metrics name the same daemon


def assert_dead_letters(letters: list[DeadLetter]) -> None:
    """Exactly the always-failing job (after 3 attempts) and the unroutable message."""
    by_ns = {d.message.stream.namespace: d for d in letters}
    assert len(letters) == 2 and set(by_ns) == {"jobs", "nobody"}
    assert by_ns["jobs"].attempts == 3 and by_ns["jobs"].error_type == "RuntimeError"
    assert by_ns["jobs"].message.stream.key == "k3"
    assert by_ns["nobody"].attempts == 0 and by_ns["nobody"].error_type == "Unroutable"
