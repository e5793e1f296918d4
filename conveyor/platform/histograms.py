"""Histograms kept in plain Python, handed to OpenTelemetry's readers when they collect.

An SDK histogram's ``record`` costs several microseconds a call (attribute cleaning,
hashing, locks, exemplar checks): more than everything else a no-op message costs. A
:class:`Series` here records a value by appending it to a list (``list.append``, a C
call: no Python frame a message) and counts what was recorded in bulk when it is
folded — by every reader before it reads, and by the daemon every
:data:`FOLD_EVERY_S`, which bounds the list: the bucket of each value, the sum, min
and max, with C loops for the common case (every value in the first bucket). When a
reader collects, :meth:`LocalMetrics.merge` adds each family to the collected
:class:`~opentelemetry.sdk.metrics.export.MetricsData` as the metric an SDK histogram
of the same name, unit, description and bounds would have been, so every reader — the
OTLP export, ``/metrics`` — shows the same numbers, under the same names and types, as
before.

Threads: values are appended by the event loop and folded by whoever reads (the loop,
exporters' threads), under a lock; the counts, sum, min and max are written by folds
only. A fold takes the values recorded so far in one step and removes exactly those
(each atomic under the GIL), so a value appended meanwhile waits for the next fold. A
reader folds and copies counts, sum, min and max under the same lock
(:meth:`Series.snapshot`), so they always describe the same values, and derives
``count`` from the buckets.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Metric, MetricsData
    from opentelemetry.sdk.resources import Resource

FOLD_EVERY_S = 0.1
"""How often a daemon with a meter folds what its histograms recorded: the values a
series holds unfolded are at most this long's worth of handler calls (about 100,000
at a million a second, ~3 MB)."""


class Series:
    """One attribute set of a :class:`HistogramFamily`: bucket counts, sum, min and max.

    ``counts[i]`` counts values ``v`` with ``bounds[i-1] < v <= bounds[i]`` (the last:
    above every bound), as OpenTelemetry's explicit-bucket histogram counts them.
    """

    __slots__ = ("_folding", "attributes", "bounds", "counts", "max", "min", "pending",
                 "started_ns", "sum")

    def __init__(self, bounds: Sequence[float], attributes: Mapping[str, str]) -> None:
        self.bounds = tuple(bounds)
        self.attributes = dict(attributes)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.started_ns = time.time_ns()
        self.pending: list[float] = []
        """Values recorded and not folded yet (``pending.append`` is the recorder the
        hot path holds: ``delivery.metrics.recorder``)."""
        self._folding = threading.Lock()

    def record(self, value: float) -> None:
        """Record ``value``: counted at the next :meth:`fold`."""
        self.pending.append(value)

    def fold(self) -> None:
        """Count the values recorded since the last fold (any thread, one at a time)."""
        with self._folding:
            self._fold()

    def snapshot(self) -> tuple[list[int], float, float, float]:
        """Fold, then copy the counts, sum, min and max — under the fold's lock, so they
        agree: no fold of another thread lands between them (a reader that copied the
        counts of a fold and the sum from before it gave a delta reader a count with
        no sum, for good)."""
        with self._folding:
            self._fold()
            return list(self.counts), self.sum, self.min, self.max

    def _fold(self) -> None:
        pending = self.pending
        n = len(pending)
        if not n:
            return
        values = pending[:n]
        del pending[:n]  # exactly those: values appended meanwhile stay
        counts, bounds = self.counts, self.bounds
        low, high = min(values), max(values)
        if high <= bounds[0]:  # fast handlers: all in the first bucket
            counts[0] += n
        else:
            slow = [v for v in values if v > bounds[0]]
            counts[0] += n - len(slow)
            for value in slow:
                counts[bisect_left(bounds, value)] += 1
        self.sum += sum(values)
        if low < self.min:
            self.min = low
        if high > self.max:
            self.max = high


class HistogramFamily:
    """One histogram instrument: its name, unit, description, bounds, and a
    :class:`Series` per attribute set."""

    def __init__(self, name: str, unit: str, description: str,
                 bounds: Sequence[float]) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.bounds = tuple(bounds)
        self._series: dict[tuple[tuple[str, str], ...], Series] = {}

    def series(self, attributes: Mapping[str, str]) -> Series:
        """The series of ``attributes`` (the same object for the same attributes)."""
        key = tuple(sorted(attributes.items()))
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = Series(self.bounds, attributes)
        return found

    def all_series(self) -> list[Series]:
        return list(self._series.values())

    def fold(self) -> None:
        """:meth:`Series.fold` of every series."""
        for series in self.all_series():
            series.fold()

    def merged_counts(self) -> list[int]:
        """Every series' bucket counts added up (each folded, then copied in one step,
        as a reader does)."""
        total = [0] * (len(self.bounds) + 1)
        for series in self.all_series():
            for i, n in enumerate(series.snapshot()[0]):
                total[i] += n
        return total


def percentile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The ``q``-quantile (0 < q <= 1) of values counted in buckets, interpolated linearly
    inside its bucket (the first bucket starts at 0; a value above every bound counts as
    the last bound, the most a bucket can say); None when nothing was counted."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * (rank - seen) / n
        seen += n
    return float(bounds[-1])


class RecentPercentiles:
    """Percentiles of what a :class:`HistogramFamily` counted since the last call: the
    latency of the last few seconds, not of the process's life.

    Calls closer together than ``min_window_s`` repeat the last answer (a window of a few
    milliseconds holds too few values to say anything).
    """

    def __init__(self, family: HistogramFamily, quantiles: Sequence[float],
                 min_window_s: float = 0.5) -> None:
        self.family = family
        self.quantiles = tuple(quantiles)
        self.min_window_s = min_window_s
        self._since: tuple[list[int], float] | None = None
        self._last: dict[float, float] = {}

    def sample(self, now: float) -> dict[float, float]:
        """Quantile -> value over the window ending ``now``; empty if nothing was counted."""
        counts = self.family.merged_counts()
        if self._since is not None and now - self._since[1] < self.min_window_s:
            return self._last
        before = self._since[0] if self._since is not None else [0] * len(counts)
        window = [max(n - b, 0) for n, b in zip(counts, before, strict=True)]
        self._since = (counts, now)
        found = {q: percentile(self.family.bounds, window, q) for q in self.quantiles}
        self._last = {q: v for q, v in found.items() if v is not None}
        return self._last


_Snapshot = tuple[list[int], float]


class LocalMetrics:
    """The families of one :class:`~conveyor.platform.telemetry.Telemetry`, and what
    each reader saw of them last (for readers that want deltas)."""

    def __init__(self, scope: str, resource: Resource | None = None) -> None:
        self.scope = scope
        self.resource = resource
        self.families: list[HistogramFamily] = []
        self._last: dict[tuple[object, Series], tuple[_Snapshot, int]] = {}

    def fold(self) -> None:
        """:meth:`HistogramFamily.fold` of every family (see :data:`FOLD_EVERY_S`)."""
        for family in self.families:
            family.fold()

    def histogram(self, name: str, unit: str, description: str,
                  bounds: Sequence[float]) -> HistogramFamily:
        """The family ``name``, created on first use."""
        for family in self.families:
            if family.name == name:
                return family
        family = HistogramFamily(name, unit, description, bounds)
        self.families.append(family)
        return family

    def merge(self, data: MetricsData | None, reader: object = None,
              temporality: AggregationTemporality | None = None) -> MetricsData:
        """``data`` with every family that has counted something added to its
        instrumentation scope :attr:`scope` (created when absent).

        ``reader`` (any hashable object: the key of its last snapshot) and ``temporality``
        (None: cumulative): a ``DELTA`` reader gets what was counted since its previous
        collection, without min and max (known only since the start).
        """
        # The SDK's types are loaded by the first collection, not with the module: a
        # worker without a meter (the default) never loads the OpenTelemetry SDK's metrics.
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            MetricsData,
            ResourceMetrics,
            ScopeMetrics,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        temporality = temporality or AggregationTemporality.CUMULATIVE
        now = time.time_ns()
        metrics = [m for f in self.families if (m := self._metric(f, reader, temporality, now))]
        data = data or MetricsData(resource_metrics=[])
        if not metrics:
            return data
        resources = list(data.resource_metrics)
        if not resources:
            resources = [ResourceMetrics(self.resource or Resource.get_empty(), [], "")]
        first = resources[0]
        scopes = list(first.scope_metrics)
        at = next((i for i, s in enumerate(scopes) if s.scope.name == self.scope), None)
        if at is None:
            scopes.append(ScopeMetrics(InstrumentationScope(self.scope), metrics, ""))
        else:
            scopes[at] = replace(scopes[at], metrics=[*scopes[at].metrics, *metrics])
        resources[0] = replace(first, scope_metrics=scopes)
        return replace(data, resource_metrics=resources)

    def _metric(self, family: HistogramFamily, reader: object,
                temporality: AggregationTemporality, now_ns: int) -> Metric | None:
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            Histogram,
            HistogramDataPoint,
            Metric,
        )

        delta = temporality == AggregationTemporality.DELTA
        points = []
        for series in family.all_series():
            counts, total, low, high = series.snapshot()
            start = series.started_ns
            if delta:
                key = (reader, series)
                (previous, previous_sum), start = self._last.get(key, (([0] * len(counts), 0.0),
                                                                       start))
                self._last[key] = ((counts, total), now_ns)
                counts = [c - p for c, p in zip(counts, previous, strict=True)]
                total -= previous_sum
            count = sum(counts)
            if not count:
                continue  # nothing counted (in this interval): no point, as the SDK does
            points.append(HistogramDataPoint(
                attributes=series.attributes, start_time_unix_nano=start,
                time_unix_nano=now_ns, count=count, sum=total, bucket_counts=counts,
                explicit_bounds=family.bounds,
                # An interval's extremes are unknown: OTLP leaves absent fields unset.
                min=None if delta else low, max=None if delta else high,  # type: ignore[arg-type]
            ))
        if not points:
            return None
        return Metric(family.name, family.description, family.unit,
                      Histogram(points, temporality))
