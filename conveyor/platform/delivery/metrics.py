"""Metrics: the handler-duration histogram, per delivery (decode, attempts, dead letter).

Counted in plain Python (:mod:`conveyor.platform.histograms`): per message two clock
reads (one where the agent's runner times the call: the end is its run-budget read,
see :data:`DURATION_CLOCK`) and a ``list.append`` of the duration, no SDK call; the
values are counted in bulk when the series is folded (readers fold before they merge
the counts in, and a daemon every ``FOLD_EVERY_S``). The counters (handled, failed, retried,
dead-lettered) cost nothing extra: they are the plain
:class:`~conveyor.platform.delivery.chain.DeliveryStats` the dead-letter step keeps
anyway, observed by the meter when it collects. Present only when a meter is
configured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.platform.delivery.chain import Delivery, Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.telemetry import DESTINATION, HANDLER

if TYPE_CHECKING:
    from conveyor.platform.histograms import HistogramFamily, LocalMetrics, Series

Timer = tuple[Callable[[], float], "Series"]
"""A clock and the series it times into: what the shipped chain's one step takes to time
a delivery itself (see :meth:`HandlerDuration.timer`)."""

DURATION_CLOCK: Callable[[], float] = (
    time.monotonic if time.get_clock_info("monotonic").resolution <= 1e-6
    else time.perf_counter)
"""The handler-duration histogram's clock: ``time.monotonic`` where it has a fine
resolution (Linux and macOS: the clock ``perf_counter`` reads too), so the agent's
runner, which reads it after each call for its run budget anyway, takes a call's end
time from that one read; ``perf_counter`` elsewhere (Windows' monotonic ticks in ~16 ms)."""

DURATION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Bucket bounds in seconds, 0.5 ms to a minute. The SDK's default bounds (0 to 10,000)
are meant for milliseconds: in seconds every handler call fell in the first two."""


def duration_histogram(local: LocalMetrics) -> HistogramFamily:
    """``conveyor.handler.duration`` of ``local``: one series per (namespace, handler)."""
    return local.histogram("conveyor.handler.duration", "s",
                           "Time from decode to handler done, per message", DURATION_BUCKETS_S)


def recorder(series: Series) -> Callable[[float], None]:
    """:meth:`Series.record` as the hot path records a delivery: the series' list's own
    ``append``, a C call with no Python frame (the agent's runner calls it once a
    message with metrics on); the values are counted when the series is folded."""
    return series.pending.append


class HandlerDuration(Interceptor):
    """Times each delivery with ``clock`` (seconds) into ``local``'s duration histogram."""

    def __init__(self, local: LocalMetrics,
                 clock: Callable[[], float] = DURATION_CLOCK) -> None:
        self._family = duration_histogram(local)
        self._clock = clock

    def timer(self, handler: HandlerSpec) -> Timer:
        """``handler``'s series and the clock, for a step that times deliveries itself:
        :func:`~conveyor.platform.delivery.build_chain` hands them to the shipped chain's
        one step (``DeadLetterInterceptor.first_attempt``) when this interceptor is just
        outside it: a coroutine frame less a message."""
        return self._clock, self._family.series(
            {DESTINATION: handler.namespace, HANDLER: handler.name})

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        clock, series = self.timer(handler)
        record = recorder(series)

        async def timed(delivery: Delivery) -> Any:
            started = clock()
            try:
                return await next(delivery)
            finally:
                record(clock() - started)

        return timed
