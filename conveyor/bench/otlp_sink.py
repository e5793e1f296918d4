"""A collector stand-in for ``conveyor bench telemetry``: an OTLP/HTTP endpoint in its
own process.

The traced run exports the way a deployment does — ``[telemetry] exporter = "otlp"``,
the SDK's OTLP/HTTP exporter behind a ``BatchSpanProcessor``, protobuf over a
keep-alive HTTP connection — so the worker pays the encoding and the POSTs; this
process pays what a collector would (reading and decoding each request), outside the
worker's CPU time. It answers ``GET /count`` with the spans decoded so far, by kind,
and how many traces lack their producer or consumer span (spans lost on the way).

    python -m conveyor.bench.otlp_sink      # prints its endpoint, serves until stdin closes
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve() -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    lock = threading.Lock()
    kinds: Counter[str] = Counter()
    per_trace: Counter[bytes] = Counter()
    traces_ok = ExportTraceServiceResponse().SerializeToString()
    metrics_ok = ExportMetricsServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector serves it

        def _reply(self, payload: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self._reply(metrics_ok, "application/x-protobuf")
                return
            request = ExportTraceServiceRequest.FromString(body)
            with lock:
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            kinds[Span.SpanKind.Name(span.kind)] += 1
                            if span.kind in (Span.SPAN_KIND_PRODUCER, Span.SPAN_KIND_CONSUMER):
                                per_trace[span.trace_id] += 1
            self._reply(traces_ok, "application/x-protobuf")

        def do_GET(self) -> None:
            with lock:
                count = {"spans": sum(kinds.values()), "by_kind": dict(kinds),
                         "incomplete_traces": sum(1 for n in per_trace.values() if n != 2)}
            self._reply(json.dumps(count).encode(), "application/json")

        def log_message(self, *args: object) -> None:
            """Quiet: the bench reads /count, not an access log."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    sys.stdin.read()  # the bench closes our stdin when it is done
    server.shutdown()


if __name__ == "__main__":
    serve()
