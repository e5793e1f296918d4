"""The duration histogram counted in plain Python: exact buckets, count and sum, and the
same numbers on every reader (the OTLP export, /metrics)."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from conveyor import App
from conveyor.platform.delivery.chain import Delivery
from conveyor.platform.delivery.metrics import DURATION_BUCKETS_S, HandlerDuration
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.histograms import LocalMetrics
from conveyor.platform.message import Message, StreamId
from conveyor.platform.metric_readers import MergingExporter, MergingPrometheusReader
from conveyor.platform.telemetry import SCOPE

# On a bound (counted in that bound's bucket), between bounds, below the first, above
# the last: every edge of the bucket rule.
DURATIONS_S = [0.0005, 0.0004, 0.001, 0.0011, 0.003, 0.1, 0.1, 0.75, 59.9, 60.0, 61.0, 0.0]


def expected_buckets(values: Sequence[float]) -> list[int]:
    """Per bucket i: values v with bounds[i-1] < v <= bounds[i] (OpenTelemetry's rule)."""
    bounds = [-math.inf, *DURATION_BUCKETS_S, math.inf]
    return [sum(1 for v in values if lo < v <= hi) for lo, hi in itertools.pairwise(bounds)]


class ScriptedClock:
    """Returns 0, d0, 0, d1, ...: each delivery's start and end, so it lasts d_i."""

    def __init__(self, durations: Sequence[float]) -> None:
        self._readings: Iterator[float] = iter([x for d in durations for x in (0.0, d)])

    def __call__(self) -> float:
        return next(self._readings)


def handler_spec() -> HandlerSpec:
    app = App("shop")

    @app.handler("orders", name="shop.on_order")
    async def on_order(body: dict[str, Any]) -> None:
        return None

    [spec] = app.handlers
    return spec


def timed_durations(local: LocalMetrics, durations: Sequence[float]) -> None:
    async def handler(_: Delivery) -> None:
        return None

    spec = handler_spec()
    step = HandlerDuration(local, clock=ScriptedClock(durations)).wrap(spec, handler)

    async def run() -> None:
        for _ in durations:
            await step(Delivery(Message("m", StreamId("orders", "k"), b"{}"), spec))

    asyncio.run(run())


def test_the_interceptor_counts_each_delivery_in_its_bucket_with_exact_count_and_sum() -> None:
    local = LocalMetrics(SCOPE)
    timed_durations(local, DURATIONS_S)
    [family] = local.families
    [series] = family.all_series()
    assert series.attributes == {"messaging.destination.name": "orders",
                                 "conveyor.handler": "shop.on_order"}
    assert sum(series.counts) == 0 and len(series.pending) == len(DURATIONS_S)  # recorded
    series.fold()  # counted (what every reader does first)
    assert series.pending == []
    assert series.counts == expected_buckets(DURATIONS_S)
    assert sum(series.counts) == len(DURATIONS_S)
    assert series.sum == sum(DURATIONS_S)  # the same additions in the same order
    assert (series.min, series.max) == (0.0, 61.0)
    # Series.record, the same rule not inlined, agrees.
    other = LocalMetrics(SCOPE).histogram("x", "s", "", DURATION_BUCKETS_S).series({})
    for d in DURATIONS_S:
        other.record(d)
    other.fold()
    assert other.counts == series.counts and other.sum == sum(DURATIONS_S)


def test_the_shipped_chain_times_in_its_one_step_exactly_as_the_interceptor_does() -> None:
    """With metrics on, build_chain hands HandlerDuration's series to the shipped chain's
    one step (no frame of its own): the same buckets, count, sum, min and max, a
    failing delivery (dead-lettered, its time counted too) included."""
    from conveyor.platform.delivery import DeliveryStats, build_chain, chain_interceptors
    from conveyor.platform.message import DeadLetter

    letters: list[DeadLetter] = []

    async def put(letter: DeadLetter) -> None:
        letters.append(letter)

    app = App("shop")

    @app.handler("orders", name="shop.on_order", retry_attempts=1)
    async def on_order(body: dict[str, Any]) -> None:
        if body.get("fail"):
            raise ValueError("refused")

    [spec] = app.handlers
    shipped = build_chain(spec, chain_interceptors(put, DeliveryStats(),
                                                   metrics=LocalMetrics(SCOPE)))
    assert shipped.__qualname__.startswith("DeadLetterInterceptor.first_attempt")
    local = LocalMetrics(SCOPE)  # the same chain, on a scripted clock
    timing = HandlerDuration(local, clock=ScriptedClock(DURATIONS_S))
    chain = build_chain(spec, [timing, *chain_interceptors(put, DeliveryStats())])
    assert chain.__qualname__ == shipped.__qualname__
    bodies = [b'{"fail": true}' if i % 3 == 0 else b"{}" for i in range(len(DURATIONS_S))]

    async def run() -> None:
        for body in bodies:
            await chain(Delivery(Message("m", StreamId("orders", "k"), body), spec))

    asyncio.run(run())
    assert len(letters) == len(DURATIONS_S[::3])
    [series] = [s for f in local.families for s in f.all_series()]
    series.fold()
    assert series.counts == expected_buckets(DURATIONS_S)
    assert series.sum == sum(DURATIONS_S)
    assert (series.min, series.max) == (0.0, 61.0)


class Captured(MetricExporter):
    def __init__(self, temporality: AggregationTemporality) -> None:
        super().__init__({HistogramInstrument: temporality})
        self.exports: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def duration_points(data: MetricsData) -> list[HistogramDataPoint]:
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics if sm.scope.name == SCOPE
            for m in sm.metrics if m.name == "conveyor.handler.duration"
            for p in m.data.data_points]  # type: ignore[misc]


class Readers:
    """A meter read as a daemon's is: an exporting reader and a Prometheus one."""

    def __init__(self, temporality: AggregationTemporality) -> None:
        self.local = LocalMetrics(SCOPE)
        self.exported = Captured(temporality)
        self.periodic = PeriodicExportingMetricReader(
            MergingExporter(self.exported, self.local), export_interval_millis=math.inf)
        self.registry = CollectorRegistry()
        self.provider = MeterProvider(metric_readers=[self.periodic, MergingPrometheusReader(
            self.local, registry=self.registry, scope_info_enabled=False)])

    def export(self) -> list[HistogramDataPoint]:
        """What the exporting reader sends now (as its timer would)."""
        self.periodic.collect()
        return duration_points(self.exported.exports[-1])

    def scrape(self) -> list[Metric]:
        """What ``/metrics`` serves now."""
        return list(text_string_to_metric_families(generate_latest(self.registry).decode()))


def readers(temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE
            ) -> Readers:
    r = Readers(temporality)
    # A daemon's meter always has its observable counters (a collection with no SDK
    # metric at all reaches no reader): the histogram joins their scope.
    r.provider.get_meter(SCOPE).create_observable_counter(
        "conveyor.messages.handled", [lambda _: [Observation(1)]])
    return r


def test_otlp_and_prometheus_readers_report_the_same_buckets_count_and_sum() -> None:
    r = readers()
    timed_durations(r.local, DURATIONS_S)
    [point] = r.export()
    families = r.scrape()
    r.provider.shutdown()
    want = expected_buckets(DURATIONS_S)
    assert list(point.bucket_counts) == want and point.count == len(DURATIONS_S)
    assert list(point.explicit_bounds) == list(DURATION_BUCKETS_S)
    assert point.sum == sum(DURATIONS_S)
    assert (point.min, point.max) == (0.0, 61.0)
    [family] = [f for f in families if f.name == "conveyor_handler_duration_seconds"]
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s for s in family.samples}
    cumulative = [sum(want[: i + 1]) for i in range(len(want))]
    les = [*(str(b) for b in DURATION_BUCKETS_S), "+Inf"]
    assert [samples["conveyor_handler_duration_seconds_bucket", le].value for le in les] == \
        cumulative
    assert samples["conveyor_handler_duration_seconds_count", None].value == point.count
    assert samples["conveyor_handler_duration_seconds_sum", None].value == point.sum
    labels = samples["conveyor_handler_duration_seconds_count", None].labels
    assert labels == {"conveyor_handler": "shop.on_order", "messaging_destination_name": "orders"}


def test_a_delta_reader_gets_what_was_counted_since_its_last_collection() -> None:
    r = readers(AggregationTemporality.DELTA)
    timed_durations(r.local, DURATIONS_S)
    [first] = r.export()
    timed_durations(r.local, [0.002, 0.002])
    [second] = r.export()
    assert r.export() == []  # nothing new: no point
    assert (first.count, second.count) == (len(DURATIONS_S), 2)
    assert list(second.bucket_counts) == expected_buckets([0.002, 0.002])
    # A fold adds the sum of the values it counts: (D) + (0.002 + 0.002), then the delta.
    assert second.sum == sum(DURATIONS_S) + sum([0.002, 0.002]) - sum(DURATIONS_S)
    assert second.start_time_unix_nano == first.time_unix_nano
    # Prometheus stays cumulative on the same counts.
    count = [s.value for f in r.scrape() for s in f.samples
             if s.name == "conveyor_handler_duration_seconds_count"]
    r.provider.shutdown()
    assert count == [len(DURATIONS_S) + 2]


def test_nothing_counted_adds_no_metric() -> None:
    local = LocalMetrics(SCOPE)
    local.histogram("conveyor.handler.duration", "s", "", DURATION_BUCKETS_S).series({})
    empty = MetricsData(resource_metrics=[])
    assert local.merge(empty) is empty


def test_a_fold_counts_what_was_recorded_and_leaves_what_comes_after_it() -> None:
    series = LocalMetrics(SCOPE).histogram("x", "s", "", DURATION_BUCKETS_S).series({})
    fast = [0.0001, 0.0005, 0.0002]  # all in the first bucket: the bulk way
    for d in fast:
        series.record(d)
    series.fold()
    assert series.counts == expected_buckets(fast) and series.pending == []
    assert (series.min, series.max, series.sum) == (0.0001, 0.0005, sum(fast))
    for d in DURATIONS_S:  # every bucket edge: the per-value way
        series.record(d)
    series.fold()
    assert series.counts == expected_buckets([*fast, *DURATIONS_S])
    assert (series.min, series.max) == (0.0, 61.0)
    series.fold()  # nothing new: nothing changes
    assert sum(series.counts) == len(fast) + len(DURATIONS_S)


def test_folds_from_another_thread_lose_and_double_nothing_while_values_arrive() -> None:
    # Exporters fold from their own threads while the loop appends: every value is
    # counted once, whichever fold takes it.
    import threading

    series = LocalMetrics(SCOPE).histogram("x", "s", "", DURATION_BUCKETS_S).series({})
    n, stop = 200_000, threading.Event()

    def reader() -> None:
        while not stop.is_set():
            series.fold()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    record = series.pending.append  # what the agent's runner holds
    for i in range(n):
        record(0.0001 if i % 10 else 0.002)
    stop.set()
    for t in readers:
        t.join()
    series.fold()
    assert series.counts == expected_buckets([0.0001] * (n - n // 10) + [0.002] * (n // 10))
    assert math.isclose(series.sum, 0.0001 * (n - n // 10) + 0.002 * (n // 10))


async def test_a_daemon_with_a_meter_folds_its_histograms_without_a_reader() -> None:
    # What bounds the values a series holds: the daemon folds every FOLD_EVERY_S.
    from conveyor.platform.config import TelemetryConfig
    from conveyor.platform.histograms import FOLD_EVERY_S
    from conveyor.platform.telemetry import Telemetry
    from conveyor.testing import TestWorker
    from tests.conftest import wait_until

    app = App("folds")

    @app.handler("orders")
    async def on_order(body: dict[str, Any]) -> None:
        return None

    telemetry = Telemetry.prometheus_only(TelemetryConfig())  # what [http] port turns on
    async with TestWorker(app, telemetry=telemetry) as worker:
        for i in range(50):
            await worker.publish("orders", f"k{i % 5}", {"i": i})
        await worker.settle()
        local = worker.daemon.telemetry.local
        assert local is not None
        [series] = [s for f in local.families for s in f.all_series()]
        await wait_until(lambda: not series.pending, 10 * FOLD_EVERY_S + 5,
                         what="the daemon's fold")
        counted = sum(series.counts)
    telemetry.shutdown()
    assert counted == 50


def test_a_reader_sees_counts_and_sum_of_the_same_values_while_another_thread_folds() -> None:
    # A reader that copied the counts of a fold and the sum from before it gave a point
    # whose sum missed a fold's values — for good, to a delta reader (its next interval
    # counted nothing new, so had no point to carry the sum).
    import sys
    import threading

    local = LocalMetrics(SCOPE)
    series = local.histogram("h", "s", "", (0.5, 1.0)).series({"a": "b"})
    stop = threading.Event()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can

    def loop() -> None:  # the event loop: records (the per-value way: 2.0 > every bound)
        while not stop.is_set():
            for _ in range(5000):
                series.pending.append(2.0)
            series.fold()

    folding = threading.Thread(target=loop)
    folding.start()
    mismatched, seen = [], 0
    delta_count, delta_sum = 0, 0.0
    try:
        for _ in range(300):
            for temporality, key in ((AggregationTemporality.CUMULATIVE, "c"),
                                     (AggregationTemporality.DELTA, "d")):
                data = local.merge(None, key, temporality)
                points = [p for rm in data.resource_metrics for sm in rm.scope_metrics
                          for m in sm.metrics for p in m.data.data_points]
                for point in points:
                    seen += 1
                    if point.sum != 2.0 * point.count:
                        mismatched.append((temporality.name, point.count, point.sum))
                    if temporality is AggregationTemporality.DELTA:
                        delta_count += point.count
                        delta_sum += point.sum
    finally:
        stop.set()
        folding.join()
        sys.setswitchinterval(switch)
    assert seen > 0 and mismatched == []
    assert delta_sum == 2.0 * delta_count  # every interval's sum reached a delta reader
