"""What tracing costs: the embedded pipeline with telemetry off, then on, in one run.

"Off" is the uninstrumented build by construction — the daemon selects the plain
``HandlerRuntime`` and the agent has no instrumentation — so the off figure *is* the
"instrumentation removed" figure; the benchmark reports it next to telemetry on (SDK
tracer and meter with a batch processor whose exporter drops the spans, so the cost
measured is creating, recording and exporting spans, not network I/O).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.bench.throughput import measure
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config
from conveyor.platform.telemetry import Telemetry


class _Discard(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


@dataclass(frozen=True)
class TelemetryCost:
    messages: int
    sample_ratio: float
    off_msgs_per_s: float
    off_cpu_us_per_msg: float
    on_msgs_per_s: float
    on_cpu_us_per_msg: float
    spans_exported: int

    @property
    def on_over_off(self) -> float:
        return self.on_msgs_per_s / self.off_msgs_per_s

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            # The common keys of every `conveyor bench ... --json`: the figure is the
            # instrumented run, the floor the uninstrumented one.
            "msgs_per_s": self.on_msgs_per_s,
            "cpu_us_per_msg": self.on_cpu_us_per_msg,
            "floor_msgs_per_s": self.off_msgs_per_s,
            "ratio": self.on_over_off,
        }

    def table(self) -> str:
        return "\n".join([
            f"messages={self.messages} (memory adapter, no-op handler), "
            f"sample_ratio={self.sample_ratio}",
            f"{'':16}{'msgs/s':>12}{'CPU us/msg':>12}",
            f"{'telemetry off':16}{self.off_msgs_per_s:>12,.0f}{self.off_cpu_us_per_msg:>12.2f}",
            f"{'telemetry on':16}{self.on_msgs_per_s:>12,.0f}{self.on_cpu_us_per_msg:>12.2f}",
            f"ratio (on / off) = {self.on_over_off:.3f}; spans exported: {self.spans_exported}",
        ])


def telemetry_cost(messages: int, repeats: int = 3, sample_ratio: float = 1.0) -> TelemetryCost:
    runs = [0]

    def make() -> QueueAdapter:
        runs[0] += 1
        reset_broker(f"tele-{runs[0]}")
        return MemoryAdapter(f"tele-{runs[0]}")

    off = asyncio.run(measure(make, Config(), adapter_name="memory", messages=messages,
                              streams=500, repeats=repeats))
    exporter = _Discard()
    tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    on = asyncio.run(measure(make, Config(), adapter_name="memory", messages=messages,
                             streams=500, repeats=repeats, telemetry=telemetry))
    tracer_provider.shutdown()
    return TelemetryCost(messages, sample_ratio, off.msgs_per_s, off.cpu_us_per_msg, on.msgs_per_s,
                         on.cpu_us_per_msg, exporter.exported)
