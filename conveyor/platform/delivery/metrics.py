"""Metrics: the handler-duration histogram, per delivery (decode, attempts, dead letter).

The counters (handled, failed, retried, dead-lettered) cost nothing extra: they are
the plain :class:`~conveyor.platform.delivery.chain.DeliveryStats` the dead-letter step
keeps anyway, observed by the meter when it collects. Present only when a meter is
configured.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.metrics import Meter

from conveyor.platform.delivery.chain import Delivery, Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.telemetry import DESTINATION, HANDLER

DURATION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Bucket bounds in seconds, 0.5 ms to a minute. The SDK's default bounds (0 to 10,000)
are meant for milliseconds: in seconds every handler call fell in the first two."""


class HandlerDuration(Interceptor):
    def __init__(self, meter: Meter) -> None:
        self._histogram = meter.create_histogram(
            "conveyor.handler.duration", "s", "Time from decode to handler done, per message",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        record = self._histogram.record
        attributes = {DESTINATION: handler.namespace, HANDLER: handler.name}
        clock = time.perf_counter

        async def timed(delivery: Delivery) -> Any:
            started = clock()
            try:
                return await next(delivery)
            finally:
                record(clock() - started, attributes)

        return timed
