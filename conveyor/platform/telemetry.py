"""OpenTelemetry: traces from producer to handler, and the platform's metrics.

Nothing here runs unless ``[telemetry] exporter`` is ``console`` or ``otlp``: with
``none`` the daemon uses the plain :class:`~conveyor.platform.runtime.HandlerRuntime`
and the client skips span creation behind a single flag check (measured against a
build without it by ``conveyor bench telemetry``), so the hot path is
the uninstrumented one. Providers are created per :class:`Telemetry` object and
passed explicitly; the process-global OpenTelemetry providers are never touched, so
an application's own OpenTelemetry set-up is left alone.

Span shape (OpenTelemetry messaging semantic conventions)::

    publish orders          PRODUCER   Client.publish; writes traceparent into headers
    └── process orders      CONSUMER   one per (message, handler): decode + handler
        ├── retry <name>    INTERNAL   one per retry (conveyor.attempt = 2, 3, ...)
        └── dead-letter     INTERNAL   when the message is dead-lettered (both in error)
    └── dead-letter         INTERNAL   a message no handler subscribes to (no consumer span)

A daemon's resource carries ``service.instance.id`` = its member id.

The first attempt gets no span of its own — the consumer span already covers it, and
spans are the dominant cost of tracing (see ``conveyor bench telemetry``).
"""

from __future__ import annotations

import contextvars
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.message import Message
from conveyor.platform.runtime import DeadLetterSink, DeliveryStats, HandlerRuntime

if TYPE_CHECKING:
    from conveyor.platform.config import TelemetryConfig

PROPAGATOR = TraceContextTextMapPropagator()
DEFAULT_SERVICE_NAME = "conveyor"
SCOPE = "conveyor"

# Semantic-convention attribute names (messaging, v1.27+).
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
KEY = "conveyor.stream.key"
HANDLER = "conveyor.handler"
ATTEMPT = "conveyor.attempt"


class Telemetry:
    """A tracer and a meter, or neither. Build with :meth:`from_config` or inject providers."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer: Tracer | None = (
            tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else None
        )
        self.meter: Meter | None = (
            meter_provider.get_meter(SCOPE) if meter_provider is not None else None
        )

    @property
    def enabled(self) -> bool:
        return self.tracer is not None or self.meter is not None

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls()

    @classmethod
    def from_config(cls, config: TelemetryConfig, instance_id: str | None = None) -> Telemetry:
        """Providers for ``config``; ``instance_id`` (a daemon's member id) becomes the
        ``service.instance.id`` resource attribute so daemons' metrics can be told apart."""
        if config.exporter == "none":
            return cls()
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            MetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )

        resource = Resource.create(resource_attributes(config, instance_id))
        span_exporter: SpanExporter
        metric_exporter: MetricExporter
        if config.exporter == "console":
            span_exporter = ConsoleSpanExporter(out=sys.stderr)
            metric_exporter = ConsoleMetricExporter(out=sys.stderr)
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            base = (config.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")).rstrip(
                "/"
            )
            headers = dict(config.headers) or None
            span_exporter = OTLPSpanExporter(
                endpoint=f"{base}/v1/traces" if base else None, headers=headers
            )
            metric_exporter = OTLPMetricExporter(
                endpoint=f"{base}/v1/metrics" if base else None, headers=headers
            )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        # Parent-based: a consumer follows its producer's decision, so a trace is whole
        # or absent; the ratio applies where a trace starts.
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        tracer_provider = SdkTracerProvider(resource=resource, sampler=sampler)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        reader = PeriodicExportingMetricReader(
            metric_exporter, export_interval_millis=config.metrics_interval_s * 1000
        )
        meter_provider = SdkMeterProvider(resource=resource, metric_readers=[reader])
        return cls(tracer_provider, meter_provider)

    def shutdown(self) -> None:
        """Flush and stop exporters (SDK providers only)."""
        for provider in (self.tracer_provider, self.meter_provider):
            shutdown = getattr(provider, "shutdown", None)
            if callable(shutdown):
                shutdown()

    # -- producer side -----------------------------------------------------------------
    def publish_span(self, msg: Message, system: str, queue: int) -> Any:
        """Start the producer span of ``msg`` and write its context into the headers."""
        assert self.tracer is not None
        span = self.tracer.start_span(
            f"publish {msg.stream.namespace}",
            kind=SpanKind.PRODUCER,
            attributes={
                SYSTEM: system,
                DESTINATION: msg.stream.namespace,
                PARTITION: str(queue),
                OPERATION_TYPE: "send",
                OPERATION_NAME: "publish",
                MESSAGE_ID: msg.id,
                KEY: msg.stream.key,
            },
        )
        PROPAGATOR.inject(msg.headers, context=trace.set_span_in_context(span))
        return span

    # -- metrics -----------------------------------------------------------------------
    def observe(
        self, name: str, unit: str, description: str,
        read: Callable[[], Iterable[tuple[float, Mapping[str, str]]]], counter: bool = False,
    ) -> None:
        """Register an observable instrument that reads values when metrics are collected."""
        if self.meter is None:
            return

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, dict(attrs)) for value, attrs in read()]

        if counter:
            self.meter.create_observable_counter(name, [callback], unit, description)
        else:
            self.meter.create_observable_gauge(name, [callback], unit, description)


_attempts: contextvars.ContextVar[list[int]] = contextvars.ContextVar("conveyor_attempts")


class InstrumentedRuntime(HandlerRuntime):
    """The runtime with spans and a duration histogram; used only when telemetry is on."""

    def __init__(
        self,
        dead_letter: DeadLetterSink,
        stats: DeliveryStats,
        telemetry: Telemetry,
        *,
        system: str,
        group: str,
        queue_of: Callable[[Message], int],
    ) -> None:
        super().__init__(dead_letter, stats)
        self._tracer = telemetry.tracer
        self._system = system
        self._group = group
        self._queue_of = queue_of
        self._wrapped: dict[str, HandlerSpec] = {}
        self._duration_attrs: dict[str, dict[str, str]] = {}
        self._duration = (
            telemetry.meter.create_histogram(
                "conveyor.handler.duration", "s", "Time from decode to handler done, per message"
            )
            if telemetry.meter is not None
            else None
        )

    def _instrument(self, spec: HandlerSpec) -> HandlerSpec:
        wrapped = self._wrapped.get(spec.name)
        if wrapped is not None:
            return wrapped
        tracer = self._tracer
        fn = spec.fn
        name = spec.name

        async def traced(*args: Any) -> Any:
            counter = _attempts.get(None)
            attempt = 1
            if counter is not None:
                counter[0] += 1
                attempt = counter[0]
            if tracer is None or attempt == 1:
                return await fn(*args)
            with tracer.start_as_current_span(
                f"retry {name}", attributes={HANDLER: name, ATTEMPT: attempt}
            ):
                return await fn(*args)

        wrapped = self._wrapped[spec.name] = replace(spec, fn=traced)
        return wrapped

    async def deliver(self, spec: HandlerSpec, msg: Message) -> None:
        token = _attempts.set([0])
        started = time.perf_counter()
        try:
            if self._tracer is None:
                await super().deliver(self._instrument(spec), msg)
            else:
                parent = PROPAGATOR.extract(msg.headers)
                with self._tracer.start_as_current_span(
                    f"process {msg.stream.namespace}",
                    context=parent,
                    kind=SpanKind.CONSUMER,
                    attributes={
                        SYSTEM: self._system,
                        DESTINATION: msg.stream.namespace,
                        PARTITION: str(self._queue_of(msg)),
                        OPERATION_TYPE: "process",
                        OPERATION_NAME: "process",
                        MESSAGE_ID: msg.id,
                        CONSUMER_GROUP: self._group,
                        KEY: msg.stream.key,
                        HANDLER: spec.name,
                    },
                ):
                    await super().deliver(self._instrument(spec), msg)
        finally:
            _attempts.reset(token)
            if self._duration is not None:
                attrs = self._duration_attrs.get(spec.name)
                if attrs is None:
                    attrs = self._duration_attrs[spec.name] = {
                        DESTINATION: spec.namespace, HANDLER: spec.name
                    }
                self._duration.record(time.perf_counter() - started, attrs)

    async def dead_letter(
        self, spec: HandlerSpec | None, msg: Message, exc: BaseException | str, attempts: int
    ) -> None:
        if self._tracer is None:
            await super().dead_letter(spec, msg, exc, attempts)
            return
        error_type = type(exc).__name__ if isinstance(exc, BaseException) else "Unroutable"
        consumer = trace.get_current_span()
        # An unroutable message has no consumer span around it: continue the producer's
        # trace from the headers rather than starting an orphan trace.
        context = None if consumer.get_span_context().is_valid else PROPAGATOR.extract(
            msg.headers)
        status = Status(StatusCode.ERROR, f"dead-lettered: {error_type}")
        with self._tracer.start_as_current_span(
            "dead-letter", context=context,
            attributes={"error.type": error_type, ATTEMPT: attempts, MESSAGE_ID: msg.id},
        ) as span:
            await super().dead_letter(spec, msg, exc, attempts)
            span.set_status(status)
        if consumer.is_recording():
            consumer.set_attribute("error.type", error_type)
            consumer.set_status(status)


def resource_attributes(config: TelemetryConfig, instance_id: str | None) -> dict[str, str]:
    """What the resource says about this process, before the SDK merges ``OTEL_*``.

    ``service.name`` left at its default yields to ``OTEL_SERVICE_NAME``; attributes
    given here win over ``OTEL_RESOURCE_ATTRIBUTES`` (the SDK's merge order).
    """
    attrs: dict[str, str] = {}
    if config.service_name != DEFAULT_SERVICE_NAME or not os.environ.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = config.service_name
    if instance_id is not None:
        attrs["service.instance.id"] = instance_id
    attrs.update(config.resource_attributes)
    return attrs


def stats_observations(
    stats: DeliveryStats,
) -> dict[str, Callable[[], Sequence[tuple[float, Mapping[str, str]]]]]:
    return {
        "handled": lambda: [(stats.handled, {})],
        "failed": lambda: [(stats.failed_attempts, {})],
        "retried": lambda: [(stats.retried, {})],
        "dead_lettered": lambda: [(stats.dead_lettered, {})],
    }

