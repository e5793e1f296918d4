"""OpenTelemetry: traces from producer to handler, and the platform's metrics.

Nothing here runs unless ``[telemetry] exporter`` is ``console`` or ``otlp``, or
``[http] port`` asks for ``/metrics`` (then metrics, without traces): otherwise the
daemon's delivery chains hold no tracing or metrics step (see
:mod:`conveyor.platform.delivery`) and the client skips span creation behind a single
flag check (measured against a build without it by ``conveyor bench telemetry``), so
the hot path is the uninstrumented one. Providers are created per :class:`Telemetry`
object and passed explicitly; the process-global OpenTelemetry providers are never
touched, so an application's own OpenTelemetry set-up is left alone.

The consumer side — spans per delivery, the duration histogram — lives in the
delivery chain (:mod:`conveyor.platform.delivery.tracing`, ``.metrics``); this module
holds the providers, the producer span and the attribute names. A daemon's resource
carries ``service.instance.id`` = its member id.

``/metrics`` is the same meter read by a second reader, OpenTelemetry's
``PrometheusMetricReader``, into a registry of this object's own (never
``prometheus_client``'s global one): the names are the OTLP ones translated by the
exporter's rules (``conveyor.messages.handled`` -> ``conveyor_messages_handled_total``,
``conveyor.handler.duration`` in ``s`` -> ``conveyor_handler_duration_seconds``).

Nothing is recorded through the SDK per message: counters are read from plain counts
when a reader collects, and the duration histogram is counted in plain Python
(:attr:`Telemetry.local`, :mod:`conveyor.platform.histograms`) and merged into what
each reader built here collects — the OTLP export and ``/metrics`` alike.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from random import getrandbits
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    TracerProvider,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conveyor.platform.message import H_TRACEPARENT, H_TRACESTATE, Message
from conveyor.platform.throttled_log import RepeatFilter
from conveyor.platform.trace_context import current_span

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace.export import SpanExporter
    from prometheus_client import CollectorRegistry

    from conveyor.platform.config import TelemetryConfig
    from conveyor.platform.delivery.chain import DeliveryStats
    from conveyor.platform.histograms import LocalMetrics
    from conveyor.platform.sampling import RatioRoots
    from conveyor.platform.spans import LeanRecorder, LeanSpan

PROPAGATOR = TraceContextTextMapPropagator()

HEADER_WARNING_REPEAT_S = 30.0
"""How often one of OpenTelemetry's warnings about a message's trace headers passes."""
_HEADER_LOGGERS = ("opentelemetry.trace.span", "opentelemetry.trace.propagation.tracecontext")
"""Where the API warns of a malformed ``tracestate`` (``TraceState.from_header``) or a
``traceparent``/``tracestate`` past its length limit (the propagator)."""


def _header_warning_kind(record: logging.LogRecord) -> str | None:
    """OpenTelemetry's API logs a warning each time it reads a ``tracestate`` that breaks
    the W3C rules, or a trace header past its length limit: a producer that sends one
    on every message would log a line a message. Its warnings are throttled by their
    format (not the header's value, which a producer can vary), one line of each every
    :data:`HEADER_WARNING_REPEAT_S`; what the API then does — it drops the bad
    ``tracestate`` — is unchanged."""
    return str(record.msg) if record.levelno >= logging.WARNING else None


_header_repeats = RepeatFilter(_header_warning_kind, lambda: HEADER_WARNING_REPEAT_S)
for _name in _HEADER_LOGGERS:
    logging.getLogger(_name).addFilter(_header_repeats)
DEFAULT_SERVICE_NAME = "conveyor"
SCOPE = "conveyor"
SAMPLED = TraceFlags.SAMPLED
RANDOM_TRACE_ID = 0x02
"""The W3C level-2 flag: the trace id's right 7 bytes are random (the SDK's ids are)."""
ROOT_FLAGS = SAMPLED | RANDOM_TRACE_ID
"""A kept new trace's flags, as the SDK sets them on a root whose id it drew."""
ID_LIMIT = (1 << 64) - 1
"""``TraceIdRatioBased.TRACE_ID_LIMIT``: the lower 64 bits of a trace id, which the
ratio's rule compares (here without importing the SDK)."""
_PUBLISH_SHAPES = 1024
"""Producer span shapes a telemetry keeps (one a namespace and system); past that it
forgets them all and starts over, so a client publishing to namespaces it makes up
(one per tenant, say) holds a bounded set."""

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
    """A tracer and a meter, or neither. Build with :meth:`from_config` or inject providers.

    ``prometheus`` is the registry a ``PrometheusMetricReader`` of ``meter_provider``
    writes to, when ``/metrics`` is served (:meth:`prometheus_text` renders it).

    ``local`` holds the histograms counted in plain Python (with a meter; created when
    not given). The readers :meth:`from_config` builds merge them into what they
    collect; a reader of an injected ``meter_provider`` does not: read them with
    ``telemetry.local.merge(reader_data)``.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        prometheus: CollectorRegistry | None = None,
        local: LocalMetrics | None = None,
        *,
        recorder: LeanRecorder | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.recorder = recorder if tracer_provider is not None else None
        """Where consumer spans go when they are not the SDK's (a processor of
        ``tracer_provider``, so its flush and shutdown cover them): what
        :meth:`from_config` builds for the OTLP exporter; None: the SDK records them
        (also once a span processor is added to the provider: see
        :meth:`~conveyor.platform.spans.LeanRecorder.hand_to_sdk`)."""
        if self.recorder is not None:
            self.recorder.on_hand_to_sdk(self._sdk_spans)
        self.meter_provider = meter_provider
        self.prometheus = prometheus
        if meter_provider is not None and local is None:
            from conveyor.platform.histograms import LocalMetrics

            local = LocalMetrics(SCOPE)
        self.local = local if meter_provider is not None else None
        self.tracer: Tracer | None = (
            tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else None
        )
        self._publish_shapes: dict[tuple[str, str], Callable[..., LeanSpan]] = {}
        """Lean producer spans' makers (a shape each), by namespace and messaging
        system."""
        self.roots: RatioRoots | None = None
        if self.tracer is not None:
            from conveyor.platform.sampling import ratio_roots

            self.roots = ratio_roots(self.tracer)
        self.meter: Meter | None = (
            meter_provider.get_meter(SCOPE) if meter_provider is not None else None
        )

    def _sdk_spans(self) -> None:
        """Producer spans from now on are the SDK's (:meth:`LeanRecorder.hand_to_sdk
        <conveyor.platform.spans.LeanRecorder.hand_to_sdk>`); so is every consumer span
        of a chain built from now on (the daemon reads :attr:`recorder` then)."""
        self.recorder = None
        self._publish_shapes.clear()

    @property
    def enabled(self) -> bool:
        return self.tracer is not None or self.meter is not None

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls()

    @classmethod
    def from_config(
        cls, config: TelemetryConfig, instance_id: str | None = None, *, prometheus: bool = False
    ) -> Telemetry:
        """Providers for ``config``; ``instance_id`` (a daemon's member id) becomes the
        ``service.instance.id`` resource attribute so daemons' metrics can be told apart.
        ``prometheus`` adds a reader for ``/metrics`` (a meter even with exporter
        ``none``, but no tracer: the endpoint serves metrics only)."""
        if config.exporter == "none":
            return cls.prometheus_only(config, instance_id) if prometheus else cls()
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            MetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
        )

        from conveyor.platform.resources import create_resource

        resource = create_resource(resource_attributes(config, instance_id))
        span_exporter: SpanExporter
        metric_exporter: MetricExporter
        lean_exporter = None
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
            # The consumer spans' own (see below): its thread and the batch processor's
            # must not share one HTTP session.
            lean_exporter = OTLPSpanExporter(
                endpoint=f"{base}/v1/traces" if base else None, headers=headers
            )
            metric_exporter = OTLPMetricExporter(
                endpoint=f"{base}/v1/metrics" if base else None, headers=headers
            )
        from conveyor.platform.sampling import ratio_tracer_provider
        from conveyor.platform.span_recorder import batch_settings

        batching = batch_settings()  # Conveyor's defaults: a producer's bursts too
        tracer_provider = ratio_tracer_provider(config.sample_ratio, resource)
        recorder = None
        if lean_exporter is not None:  # consumer spans encoded by hand (docs/telemetry.md)
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope

            from conveyor.platform.spans import LeanRecorder, otlp_sender

            send = otlp_sender(lean_exporter)
            if send is not None:
                recorder = LeanRecorder(send, resource, InstrumentationScope(SCOPE),
                                        **batching._asdict(), close=lean_exporter.shutdown)
                # A processor of the provider: its flush and shutdown cover the
                # recorder, which it shuts down first (in the order they were added).
                tracer_provider.add_span_processor(recorder)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter,
                                                              **batching._asdict()))
        if recorder is not None:  # one added later must see every span: see hand_to_sdk
            tracer_provider.processor_added = recorder.hand_to_sdk
        from conveyor.platform.histograms import LocalMetrics
        from conveyor.platform.metric_readers import MergingExporter

        local = LocalMetrics(SCOPE, resource)
        readers: list[MetricReader] = [PeriodicExportingMetricReader(
            MergingExporter(metric_exporter, local),
            export_interval_millis=config.metrics_interval_s * 1000,
        )]
        registry = None
        if prometheus:
            registry, reader = _prometheus_reader(local)
            readers.append(reader)
        meter_provider = SdkMeterProvider(resource=resource, metric_readers=readers)
        return cls(tracer_provider, meter_provider, registry, local, recorder=recorder)

    @classmethod
    def prometheus_only(cls, config: TelemetryConfig, instance_id: str | None = None) -> Telemetry:
        """A meter read only by ``/metrics``: no tracer, no exporter, no export thread."""
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

        from conveyor.platform.histograms import LocalMetrics
        from conveyor.platform.resources import create_resource

        resource = create_resource(resource_attributes(config, instance_id))
        local = LocalMetrics(SCOPE, resource)
        registry, reader = _prometheus_reader(local)
        provider = SdkMeterProvider(resource=resource, metric_readers=[reader])
        return cls(None, provider, registry, local)

    def prometheus_text(self) -> bytes:
        """The meter's instruments now, in the Prometheus text format (``/metrics``).

        Collecting runs the observable instruments' callbacks in the caller's thread:
        the event loop's, for the worker's endpoint."""
        from prometheus_client import generate_latest

        assert self.prometheus is not None, "built without prometheus=True"
        return generate_latest(self.prometheus)

    def shutdown(self) -> None:
        """Flush and stop exporters (SDK providers only)."""
        for provider in (self.tracer_provider, self.meter_provider):
            shutdown = getattr(provider, "shutdown", None)
            if callable(shutdown):
                shutdown()

    # -- producer side -----------------------------------------------------------------
    def publish_span(self, msg: Message, system: str, queue: int,
                     parent: SpanContext | None = None) -> Span:
        """Start the producer span of ``msg`` and write its context into the headers.

        ``parent``: the current span's context, when the caller read it already (a
        batch's messages share it: ``Client.publish_batch`` reads it once); None: read
        here.

        A new trace the ratio drops gets only its ``traceparent`` (see
        :class:`RatioRoots`) and a non-recording span. A kept one — a new trace the
        ratio keeps, or a child of a sampled span — is a
        :class:`~conveyor.platform.spans.LeanSpan` when there is a :attr:`recorder`
        (the SDK span costs some 50 µs to start, end and encode; a lean one 6), else
        the SDK's. A child of a dropped parent is what the parent-based sampler makes,
        a non-recording span of the parent's trace, made here, but for a parent with a
        ``tracestate`` (the SDK's, to carry it). A lean span goes to the recorder only,
        so a span processor added to the provider makes them SDK spans from then on;
        the recorder's span limits apply (see docs/telemetry.md).

        A ``traceparent`` the caller gave in the headers is the span's parent, not the
        current span (with its ``tracestate``): the message is published in the trace
        it names. The headers then carry the span's own pair, as for any message: a
        given ``tracestate`` goes only with the traceparent it came with, and is
        dropped where that is missing or no trace context (W3C)."""
        assert self.tracer is not None
        context = None  # the SDK span's parent: the current span's
        headers = msg.headers
        if headers and (H_TRACEPARENT in headers or H_TRACESTATE in headers):
            given = _take_trace_context(headers)
            if given.is_valid:
                parent, context = given, trace.set_span_in_context(NonRecordingSpan(given))
        roots = self.roots
        if roots is not None:
            if parent is None:
                parent = current_span().get_span_context()
            if not parent.is_valid:  # a new trace: decided here, the SDK's way
                # RatioRoots.draw and random_span_id, inlined (a call each a message)
                trace_id = getrandbits(128) or 1
                if trace_id & ID_LIMIT >= roots.bound:  # dropped: only its traceparent
                    span_id = getrandbits(64) or 1  # (the span's context built if asked)
                    msg.headers["traceparent"] = f"00-{trace_id:032x}-{span_id:016x}-02"
                    return roots.new_dropped(trace_id, span_id)
                if self.recorder is not None:
                    return self._lean_publish(msg, system, queue, trace_id, 0, ROOT_FLAGS,
                                              False, None)
                roots.take_next(trace_id)  # the SDK's root takes the id decided on
            elif parent.trace_flags & SAMPLED:
                if self.recorder is not None:
                    return self._lean_publish(
                        msg, system, queue, parent.trace_id, parent.span_id,
                        SAMPLED | (parent.trace_flags & RANDOM_TRACE_ID), parent.is_remote,
                        parent.trace_state or None)
            elif not parent.trace_state:  # a dropped parent: the sampler drops the child
                span_id, flags = random_span_id(), parent.trace_flags & RANDOM_TRACE_ID
                msg.headers["traceparent"] = (
                    f"00-{parent.trace_id:032x}-{span_id:016x}-{flags:02x}")
                return roots.dropped_span(parent.trace_id, span_id, flags)
        span = self.tracer.start_span(
            f"publish {msg.stream.namespace}",
            context=context,
            kind=SpanKind.PRODUCER,
            attributes={**_publish_fixed(msg.stream.namespace, system),
                        **_publish_attributes(msg, queue)},
        )
        _write_traceparent(msg, span)
        return span

    def _lean_publish(self, msg: Message, system: str, queue: int, trace_id: int,
                      parent_id: int, flags: int, remote: bool,
                      trace_state: TraceState | None) -> Span:
        namespace = msg.stream.namespace
        shapes = self._publish_shapes
        lean = shapes.get((namespace, system))
        if lean is None:  # a span of this shape, as ConsumerScope makes its own
            from conveyor.platform.spans import LeanSpan, SpanShape

            assert self.recorder is not None
            if len(shapes) >= _PUBLISH_SHAPES:  # namespaces made up on the fly: forget
                shapes.clear()
            lean = shapes[namespace, system] = partial(LeanSpan, SpanShape(
                self.recorder, f"publish {namespace}", SpanKind.PRODUCER,
                _publish_fixed(namespace, system)))
        span = lean(trace_id, random_span_id(), parent_id, flags,
                    _publish_attributes(msg, queue), parent_is_remote=remote,
                    trace_state=trace_state)
        _write_traceparent(msg, span)
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


def random_span_id() -> int:
    """A span id as the SDK's ``RandomIdGenerator`` draws it (never 0)."""
    return random.getrandbits(64) or 1


def _publish_fixed(namespace: str, system: str) -> dict[str, str]:
    """The attributes every producer span of ``namespace`` on ``system`` has."""
    return {SYSTEM: system, DESTINATION: namespace, OPERATION_TYPE: "send",
            OPERATION_NAME: "publish"}


def _publish_attributes(msg: Message, queue: int) -> dict[str, str]:
    """A producer span's attributes that differ from message to message."""
    return {PARTITION: str(queue), MESSAGE_ID: msg.id, KEY: msg.stream.key}


def _take_trace_context(headers: dict[str, str]) -> SpanContext:
    """The trace context of the ``traceparent`` and ``tracestate`` in ``headers``,
    taken out of them (invalid where there is none)."""
    given = {name: headers.pop(name) for name in (H_TRACEPARENT, H_TRACESTATE)
             if name in headers}
    return trace.get_current_span(PROPAGATOR.extract(given)).get_span_context()


def _write_traceparent(msg: Message, span: Span) -> None:
    """Write ``span``'s context into ``msg``'s headers, as the propagator does."""
    context = span.get_span_context()
    if context.trace_state or not context.is_valid:
        PROPAGATOR.inject(msg.headers, context=trace.set_span_in_context(span))
    else:  # what the propagator writes for a span without a tracestate
        msg.headers["traceparent"] = (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}")


def _prometheus_reader(local: LocalMetrics) -> tuple[CollectorRegistry, MetricReader]:
    from prometheus_client import CollectorRegistry

    from conveyor.platform.metric_readers import MergingPrometheusReader

    registry = CollectorRegistry(auto_describe=True)
    # One instrumentation scope ("conveyor"): its otel_scope_* labels on every series
    # would tell nothing apart.
    return registry, MergingPrometheusReader(local, registry=registry, scope_info_enabled=False)


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
        "skipped": lambda: [(stats.skipped, {})],
    }

