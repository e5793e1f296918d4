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


class HandlerDuration(Interceptor):
    def __init__(self, meter: Meter) -> None:
        self._histogram = meter.create_histogram(
            "conveyor.handler.duration", "s", "Time from decode to handler done, per message"
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
