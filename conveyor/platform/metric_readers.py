"""OpenTelemetry's readers with the plain-Python histograms of
:mod:`conveyor.platform.histograms` merged into what they collect: the OTLP export's
and ``/metrics``'. Apart from that module, so that loading the histograms (every
worker does) loads no OpenTelemetry SDK and no Prometheus client: these are loaded
when a meter is built (``[telemetry] exporter`` or ``[http] port`` set)."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from conveyor.platform.histograms import LocalMetrics


class MergingExporter(MetricExporter):
    """``exporter`` (OTLP, console) with ``local``'s families merged into every export,
    in the temporality ``exporter`` prefers for histograms."""

    def __init__(self, exporter: MetricExporter, local: LocalMetrics) -> None:
        # The periodic reader asks its exporter for these: pass the wrapped one's on.
        preferred = exporter._preferred_temporality
        super().__init__(preferred, exporter._preferred_aggregation)
        self._exporter = exporter
        self._local = local
        self._temporality = (preferred or {}).get(
            HistogramInstrument, AggregationTemporality.CUMULATIVE)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        merged = self._local.merge(metrics_data, self, self._temporality)
        return self._exporter.export(merged, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


class MergingPrometheusReader(PrometheusMetricReader):
    """OpenTelemetry's Prometheus reader with ``local``'s families merged into what it
    collects (cumulative, as Prometheus wants)."""

    def __init__(self, local: LocalMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local = local

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        super()._receive_metrics(self._local.merge(metrics_data, self),
                                 timeout_millis=timeout_millis, **kwargs)
