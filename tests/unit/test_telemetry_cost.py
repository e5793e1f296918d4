"""The telemetry benchmark compares what it says it compares."""

from __future__ import annotations

from conveyor.bench.telemetry_cost import Figure, TelemetryCost, _run_in_subprocess


def test_the_uninstrumented_run_publishes_without_the_tracing_hooks() -> None:
    stripped = _run_in_subprocess("uninstrumented", 300, 1.0)
    off = _run_in_subprocess("off", 300, 1.0)
    on = _run_in_subprocess("on", 300, 1.0)
    metrics = _run_in_subprocess("metrics", 300, 1.0)
    assert stripped["publish_hooks"] == []
    assert off["publish_hooks"] == on["publish_hooks"] == metrics["publish_hooks"] == [
        "_traced", "publish_span", "telemetry"]
    assert stripped["spans_exported"] == off["spans_exported"] == 0
    assert metrics["spans_exported"] == 0  # /metrics alone traces nothing
    # A producer and a consumer span per message, received over OTLP/HTTP by the
    # endpoint the run started (600 spans cannot overflow the default queue of 2048).
    assert on["spans_exported"] == 2 * 300 and on["spans_lost"] == 0
    assert all(r["msgs_per_s"] > 0 for r in (stripped, off, on, metrics))


def test_off_is_within_noise_only_when_it_differs_less_than_uninstrumented_runs_do() -> None:
    def cost(off_rate: float) -> TelemetryCost:
        base = Figure(100.0, 95.0, 105.0, 1.0)  # spread 10 %
        return TelemetryCost(1, 3, 1.0, base, Figure(off_rate, off_rate, off_rate, 1.0),
                             Figure(10.0, 10.0, 10.0, 9.0), 2)

    assert cost(92.0).off_within_noise and cost(108.0).off_within_noise
    assert not cost(85.0).off_within_noise
    assert cost(85.0).off_over_uninstrumented == 0.85
    assert "OUTSIDE" in cost(85.0).table()
    assert cost(10.0).as_dict()["ratio"] == 1.0  # on / off, the common key
