"""Telemetry.from_config: exporters, endpoint and headers (config or OTEL_* variables),
and the resource, checked by what a local OTLP receiver or stderr actually gets."""

from __future__ import annotations

import pytest

from conveyor.platform.config import TelemetryConfig
from conveyor.platform.telemetry import Telemetry
from tests.otlp import Receiver, attributes, otlp_receiver

__all__ = ["otlp_receiver"]


def export_one_span_and_gauge(telemetry: Telemetry) -> None:
    telemetry.observe("conveyor.test.gauge", "1", "a test gauge", lambda: [(42, {"q": "3"})])
    assert telemetry.tracer is not None
    telemetry.tracer.start_span("hello").end()
    telemetry.shutdown()  # flushes both exporters


def test_otlp_endpoint_headers_and_resource_come_from_config(
    otlp_receiver: tuple[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    endpoint, received = otlp_receiver
    config = TelemetryConfig(
        exporter="otlp", endpoint=endpoint + "/", headers={"x-api-key": "s3cret"},
        service_name="orders", resource_attributes={"deployment.environment": "test"},
    )
    export_one_span_and_gauge(Telemetry.from_config(config, instance_id="orders-host-1"))
    assert set(received.paths) == {"/v1/traces", "/v1/metrics"}
    assert all(h["x-api-key"] == "s3cret" for h in received.headers)
    [(resource, span)] = received.spans
    assert span.name == "hello"
    assert resource["service.name"] == "orders"
    assert resource["service.instance.id"] == "orders-host-1"
    assert resource["deployment.environment"] == "test"
    [point] = received.metric_points("conveyor.test.gauge")
    assert point.as_int == 42 and attributes(point.attributes) == {"q": "3"}
    [(metric_resource, _)] = received.metrics
    assert metric_resource["service.instance.id"] == "orders-host-1"


def test_otlp_endpoint_headers_and_service_name_from_the_standard_environment(
    otlp_receiver: tuple[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, received = otlp_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-env")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing")
    export_one_span_and_gauge(Telemetry.from_config(TelemetryConfig(exporter="otlp")))
    assert set(received.paths) == {"/v1/traces", "/v1/metrics"}
    assert all(h["x-api-key"] == "from-env" for h in received.headers)
    [(resource, _)] = received.spans
    assert resource["service.name"] == "billing"  # the default yields to OTEL_SERVICE_NAME


def test_a_service_name_set_in_config_wins_over_otel_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing")
    telemetry = Telemetry.from_config(TelemetryConfig(exporter="console", service_name="orders"))
    resource = telemetry.tracer_provider.resource  # type: ignore[union-attr]
    telemetry.shutdown()
    assert resource.attributes["service.name"] == "orders"


def test_console_exporter_writes_spans_and_metrics_to_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    export_one_span_and_gauge(Telemetry.from_config(TelemetryConfig(exporter="console")))
    out, err = capfd.readouterr()
    assert '"name": "hello"' in err and "conveyor.test.gauge" in err
    assert "hello" not in out


def test_exporter_none_builds_no_providers() -> None:
    telemetry = Telemetry.from_config(TelemetryConfig(), instance_id="x")
    assert not telemetry.enabled and telemetry.tracer_provider is None


def test_consumer_spans_recorded_without_the_sdk_go_to_the_same_endpoint_and_resource(
    otlp_receiver: tuple[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP exporter builds a recorder for lean consumer spans (docs/telemetry.md):
    they reach the configured endpoint with its headers and the resource the SDK's spans
    carry, and shutdown flushes them."""
    from opentelemetry.trace import SpanKind

    from conveyor.platform.spans import LeanSpan, SpanShape

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    endpoint, received = otlp_receiver
    config = TelemetryConfig(exporter="otlp", endpoint=endpoint, headers={"x-api-key": "k"},
                             service_name="orders")
    telemetry = Telemetry.from_config(config, instance_id="orders-host-2")
    assert telemetry.recorder is not None
    shape = SpanShape(telemetry.recorder, "process orders", SpanKind.CONSUMER,
                      {"messaging.system": "memory"})
    LeanSpan(shape, 0xABC, 0xDEF, 0x123, 0x01, {"conveyor.stream.key": "k1"}).end()
    export_one_span_and_gauge(telemetry)
    assert received.paths.count("/v1/traces") == 2  # the SDK's post and the recorder's
    assert all(h["x-api-key"] == "k" for h in received.headers)
    by_name = {span.name: resource for resource, span in received.spans}
    assert set(by_name) == {"hello", "process orders"}
    assert by_name["process orders"] == by_name["hello"]
    assert by_name["hello"]["service.instance.id"] == "orders-host-2"


def test_no_recorder_without_the_otlp_exporter() -> None:
    assert Telemetry.from_config(TelemetryConfig(exporter="console")).recorder is None
    assert Telemetry.from_config(TelemetryConfig(exporter="none")).recorder is None
