"""The HTTP endpoint of ``conveyor worker --processes MIN:MAX``: one, the supervisor's.

The supervisor listens on ``[http] port``; each child daemon serves its own endpoint on
a loopback port the kernel picks (``127.0.0.1:0``) and reports it in its ``ready``
event. One address per pod or host, however many processes run behind it:

``/metrics``
    The supervisor's own instruments (``conveyor_supervisor_*``), then every live
    child's, scraped on the spot (concurrently, 2 s at most each) and merged family by
    family with a ``process="N"`` label (N: the child's number, as in the log), so each
    child's series stay apart. A child that does not answer in time is left out of
    that scrape (logged at most once a minute per child), never fails it.
``/healthz``
    The supervisor's event loop answers.
``/readyz``
    200 once the first processes own every queue, while at least one child is alive and
    no stop was asked for; 503 with the reason otherwise.

Why not one port per child (``port + index``): children come and go as the lag
changes, so a scraper would chase ports, and a kubelet probes one port per container.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from conveyor.platform.errors import BrokerConnectionError
from conveyor.platform.telemetry import Telemetry
from conveyor.platform.throttled_log import ThrottledLog
from conveyor.workers.http_endpoint import HttpEndpoint

if TYPE_CHECKING:
    from conveyor.workers.supervisor.supervisor import Supervisor

log = logging.getLogger("conveyor.http")

CHILD_SCRAPE_TIMEOUT_S = 2.0


def supervisor_endpoint(
    supervisor: Supervisor, telemetry: Telemetry, host: str, port: int
) -> HttpEndpoint:
    silent = ThrottledLog(log, interval_s=60.0)  # a stuck child: a line a minute, not a scrape

    async def metrics() -> bytes:
        children = [(c.number, c.http_port) for c in supervisor.children
                    if c.alive and c.http_port is not None]
        texts = await asyncio.gather(*(_scrape(p) for _, p in children),
                                     return_exceptions=True)
        scraped = []
        for (number, _), text in zip(children, texts, strict=True):
            if isinstance(text, BaseException):
                silent.log(logging.WARNING, number, "/metrics: process #%d did not answer "
                           "(%s); left out", number, text or type(text).__name__)
            else:
                scraped.append((number, text))
        return merge(telemetry.prometheus_text().decode(), scraped)

    return HttpEndpoint(host, port, metrics=metrics, readiness=supervisor.readiness)


def merge(own: str, children: Sequence[tuple[int, str]]) -> bytes:
    """One exposition of ``own`` and each child's text, the latter labelled
    ``process="N"``; families of the same name are merged into one."""
    families: dict[str, Metric] = {}
    for number, text in [(None, own), *children]:
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            if number is None:
                merged.samples.extend(family.samples)
            else:
                label = str(number)
                merged.samples.extend(s._replace(labels={**s.labels, "process": label})
                                      for s in family.samples)
    return generate_latest(_Families(families.values()))


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


async def _scrape(port: int) -> str:
    """``GET /metrics`` of a child's loopback endpoint (which closes after answering)."""
    async with asyncio.timeout(CHILD_SCRAPE_TIMEOUT_S):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = await reader.read()
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise BrokerConnectionError(head.split(b"\r\n", 1)[0].decode("latin-1") or "no answer")
    return body.decode()
