"""What telemetry costs: the same workload uninstrumented, with telemetry off, and on.

The workload (memory adapter, no-op handler): ``N`` messages published one by one
through ``Client.publish`` — where the producer span starts when tracing is on — then
one daemon started and timed until every message is handled and acknowledged. The
figure is ``N`` over the wall time of both phases; CPU is ``process_time`` over both,
and over the second alone ("consume CPU": what a worker pays, the producer's span and
sampling decision excluded; the producer's spans still queued when publishing ends are
exported before the second phase starts).

Four variants, each run in a fresh subprocess so none inherits another's heap:

``uninstrumented``
    the current tree with its telemetry hooks stripped (:func:`strip_instrumentation`):
    ``Client.publish`` as it was before telemetry existed (commit 6e213bd^) and a
    daemon that never looks at telemetry. Not the 6e213bd^ tree itself: a dozen later
    commits changed the hot path, so that tree would measure them, not the hooks.
``off``
    the shipped default, ``[telemetry] exporter = "none"``.
``on``
    what ``[telemetry] exporter = "otlp"`` builds (``Telemetry.from_config``): the
    ratio sampler (``sample_ratio``), ``BatchSpanProcessor`` at its shipped settings,
    the OTLP/HTTP exporters, to an OTLP endpoint in another process
    (:mod:`conveyor.bench.otlp_sink`, a collector's stand-in that decodes what it
    gets) — creating, recording, encoding and posting spans, all in the worker's CPU
    time; the endpoint's decoding is not. Spans the endpoint did not get (a trace
    without its producer or consumer span, or the batch queue overflowing) are
    reported as lost.
``metrics``
    what ``[http] port`` alone turns on: a meter read by the Prometheus reader of
    ``/metrics`` (no tracer), its handler-duration histogram counted per message, and
    ``/metrics`` rendered every 0.1 s during the run (a scraper asks every 15 s or so:
    this overstates the rendering share on purpose).

The runs are interleaved (u, off, on, on, off, u, ...) so drift on a shared machine
falls on every variant alike; each figure is the median of ``repeats`` runs, shown
with its spread (min..max). "Off costs nothing" holds if off / uninstrumented is
within the uninstrumented runs' own spread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.bench import BenchmarkError
from conveyor.bench.throughput import AckCounter, noop_app
from conveyor.client import Client
from conveyor.platform.config import Config, TelemetryConfig
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import DaemonMetrics, WorkerDaemon

VARIANTS = ("uninstrumented", "off", "on", "metrics")
SCRAPE_EVERY_S = 0.1
STREAMS = 500
HOOK_NAMES = frozenset({"_traced", "telemetry", "publish_span"})
"""Names the instrumented ``Client.publish`` uses and the stripped one must not."""


def strip_instrumentation() -> None:
    """Put this process on the pre-telemetry hot path.

    With telemetry off the only per-message hook left is ``Client.publish``'s
    ``_traced`` check; the daemon's choices are made once per daemon: its delivery
    chains get no tracing or metrics step (the very chain a daemon without telemetry
    would build, so there is nothing to strip there) and it registers metric callbacks,
    which is replaced by a no-op here.
    """

    async def publish(
        self: Client, namespace: str, key: str, body: Any,
        headers: Any = None, content_type: str | None = None,
    ) -> SequenceToken:
        msg = self.build(namespace, key, body, headers, content_type)
        tokens = await self.adapter.enqueue(self.mapper.queue_for(msg.stream), [msg])
        return tokens[0]

    def no_metrics(self: DaemonMetrics) -> None:
        return None

    setattr(Client, "publish", publish)  # noqa: B010 - replacing a method on purpose
    setattr(DaemonMetrics, "register", no_metrics)  # noqa: B010


class Collector:
    """An OTLP/HTTP endpoint in a process of its own (:mod:`conveyor.bench.otlp_sink`):
    what the traced run exports to, as a deployment exports to a collector."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.bench.otlp_sink"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self._proc.stdout is not None
        self.endpoint = self._proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            self.close()
            raise BenchmarkError("the OTLP endpoint of the traced run did not start")

    def count(self) -> dict[str, Any]:
        """Spans decoded so far (``spans``, ``by_kind``, ``incomplete_traces``)."""
        with urllib.request.urlopen(f"{self.endpoint}/count", timeout=10) as reply:
            result: dict[str, Any] = json.loads(reply.read())
        return result

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=10)


class QueueOverflow(logging.Handler):
    """Notices the batch processor's "Queue full, dropping" warning: spans the SDK lost
    before export (its own processor metrics are off by default)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        self.seen = self.seen or "Queue full" in record.getMessage()


def _telemetry_on(sample_ratio: float, endpoint: str) -> Telemetry:
    """What ``[telemetry] exporter = "otlp"`` builds (docs/telemetry.md), to ``endpoint``:
    the shipped OTLP/HTTP span and metric exporters, ``BatchSpanProcessor`` at its
    settings, the ratio sampler."""
    config = TelemetryConfig(exporter="otlp", endpoint=endpoint, sample_ratio=sample_ratio)
    return Telemetry.from_config(config)


async def _publish_and_handle(n: int, telemetry: Telemetry | None
                              ) -> tuple[float, float, float]:
    counter = [0]
    reset_broker("tele")
    adapter = MemoryAdapter("tele")
    acks = AckCounter(adapter, n)
    daemon = WorkerDaemon(noop_app(counter), Config(), adapter=adapter, telemetry=telemetry)
    client = Client(adapter, daemon.mapper, telemetry=telemetry)
    bodies = [(f"s{i % STREAMS}", {"i": i, "pad": "x" * 32}) for i in range(n)]
    scrapes = [0]

    async def scrape() -> None:  # what a scraper of /metrics makes the loop do
        assert telemetry is not None
        while True:
            await asyncio.sleep(SCRAPE_EVERY_S)
            telemetry.prometheus_text()
            scrapes[0] += 1

    t0, c0 = time.perf_counter(), time.process_time()
    scraping = None
    if telemetry is not None and telemetry.prometheus is not None:
        scraping = asyncio.create_task(scrape())
    for key, body in bodies:
        await client.publish("bench", key, body)
    if telemetry is not None:
        # The producer's spans still queued are exported now, by the producer: a
        # worker does not encode the spans of the process that published to it.
        flush = getattr(telemetry.tracer_provider, "force_flush", None)
        if callable(flush):
            flush()
    consume_c0 = time.process_time()
    await daemon.start()
    await asyncio.wait_for(acks.done.wait(), timeout=300)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    consume_cpu = time.process_time() - consume_c0
    if scraping is not None and telemetry is not None:
        scraping.cancel()
        if scrapes[0] == 0:  # a run too short to be scraped measured nothing of it
            telemetry.prometheus_text()
    report = await daemon.stop()
    assert report.acked == n == counter[0], (report, counter[0])
    return n / wall, cpu / n * 1e6, consume_cpu / n * 1e6


def run_variant(variant: str, messages: int, sample_ratio: float) -> dict[str, Any]:
    """One timed run of ``variant`` in this process (call it in a fresh one)."""
    if variant not in VARIANTS:
        raise InvalidArgumentError(f"variant must be one of {VARIANTS}, not {variant!r}")
    if variant == "uninstrumented":
        strip_instrumentation()
    spans = lost = 0
    if variant == "on":
        collector = Collector()
        overflow = QueueOverflow()
        logging.getLogger("opentelemetry").addHandler(overflow)
        try:
            telemetry = _telemetry_on(sample_ratio, collector.endpoint)
            rate, cpu_us, consume_us = asyncio.run(_publish_and_handle(messages, telemetry))
            telemetry.shutdown()  # flushes the batch processor to the endpoint
            received = collector.count()
        finally:
            collector.close()
        spans = received["spans"]
        lost = received["incomplete_traces"] + (1 if overflow.seen else 0)
    elif variant == "metrics":
        telemetry = Telemetry.prometheus_only(TelemetryConfig())
        rate, cpu_us, consume_us = asyncio.run(_publish_and_handle(messages, telemetry))
        telemetry.shutdown()
    else:
        rate, cpu_us, consume_us = asyncio.run(_publish_and_handle(messages, None))
    hooks = sorted(HOOK_NAMES & set(Client.publish.__code__.co_names))
    return {"variant": variant, "msgs_per_s": rate, "cpu_us_per_msg": cpu_us,
            "consume_cpu_us_per_msg": consume_us, "spans_exported": spans,
            "spans_lost": lost,
            "publish_hooks": hooks}


def _run_in_subprocess(variant: str, messages: int, sample_ratio: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.bench.telemetry_cost", variant, str(messages),
         str(sample_ratio)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise BenchmarkError(f"the {variant} run failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@dataclass(frozen=True)
class Figure:
    """One variant's runs: median and spread of msgs/s, median CPU per message (both
    phases, and consuming alone)."""

    msgs_per_s: float
    min_msgs_per_s: float
    max_msgs_per_s: float
    cpu_us_per_msg: float
    consume_cpu_us_per_msg: float = 0.0

    @classmethod
    def of(cls, runs: list[dict[str, Any]]) -> Figure:
        rates = [r["msgs_per_s"] for r in runs]
        return cls(statistics.median(rates), min(rates), max(rates),
                   statistics.median(r["cpu_us_per_msg"] for r in runs),
                   statistics.median(r["consume_cpu_us_per_msg"] for r in runs))

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart runs of the same build land."""
        return (self.max_msgs_per_s - self.min_msgs_per_s) / self.msgs_per_s


@dataclass(frozen=True)
class TelemetryCost:
    messages: int
    repeats: int
    sample_ratio: float
    uninstrumented: Figure
    off: Figure
    on: Figure
    spans_exported: int
    """Spans of one "on" run: a producer and a consumer span per sampled message."""
    metrics: Figure | None = None
    """``[http] port`` alone: the meter read by ``/metrics``, no tracer."""
    spans_lost: int = 0
    """Of the "on" runs: traces the endpoint got incomplete, plus one per run whose
    batch queue overflowed (0: every span recorded reached the endpoint)."""

    @property
    def off_over_uninstrumented(self) -> float:
        return self.off.msgs_per_s / self.uninstrumented.msgs_per_s

    @property
    def on_over_off(self) -> float:
        return self.on.msgs_per_s / self.off.msgs_per_s

    @property
    def metrics_over_off(self) -> float | None:
        return None if self.metrics is None else self.metrics.msgs_per_s / self.off.msgs_per_s

    def consume_cpu_ratio(self, variant: Figure | None) -> float | None:
        """Off's consume CPU per message over ``variant``'s: the rate a CPU-bound worker
        keeps with it on (1.0: free), read from CPU time, which a loaded machine blurs
        less than wall time."""
        if variant is None or not variant.consume_cpu_us_per_msg:
            return None
        return self.off.consume_cpu_us_per_msg / variant.consume_cpu_us_per_msg

    @property
    def off_within_noise(self) -> bool:
        """Off differs from uninstrumented by no more than uninstrumented runs differ."""
        return abs(1 - self.off_over_uninstrumented) <= self.uninstrumented.spread

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages, "repeats": self.repeats,
            "sample_ratio": self.sample_ratio,
            "uninstrumented": asdict(self.uninstrumented), "off": asdict(self.off),
            "on": asdict(self.on),
            "uninstrumented_msgs_per_s": self.uninstrumented.msgs_per_s,
            "off_msgs_per_s": self.off.msgs_per_s,
            "off_cpu_us_per_msg": self.off.cpu_us_per_msg,
            "on_msgs_per_s": self.on.msgs_per_s,
            "on_cpu_us_per_msg": self.on.cpu_us_per_msg,
            "off_over_uninstrumented": self.off_over_uninstrumented,
            "uninstrumented_spread": self.uninstrumented.spread,
            "off_within_noise": self.off_within_noise,
            "spans_exported": self.spans_exported,
            "spans_lost": self.spans_lost,
            "metrics": None if self.metrics is None else asdict(self.metrics),
            "metrics_over_off": self.metrics_over_off,
            "consume_cpu_on_over_off": self.consume_cpu_ratio(self.on),
            "consume_cpu_metrics_over_off": self.consume_cpu_ratio(self.metrics),
            # The common keys of every `conveyor bench ... --json`: the figure is the
            # instrumented run, the floor telemetry off.
            "msgs_per_s": self.on.msgs_per_s,
            "cpu_us_per_msg": self.on.cpu_us_per_msg,
            "floor_msgs_per_s": self.off.msgs_per_s,
            "ratio": self.on_over_off,
        }

    def table(self) -> str:
        def row(name: str, f: Figure) -> str:
            spread = f"{f.min_msgs_per_s:,.0f}..{f.max_msgs_per_s:,.0f}"
            return (f"{name:16}{f.msgs_per_s:>12,.0f}{spread:>22}{f.cpu_us_per_msg:>12.2f}"
                    f"{f.consume_cpu_us_per_msg:>14.2f}")

        verdict = "within" if self.off_within_noise else "OUTSIDE"
        return "\n".join([
            f"messages={self.messages} x {self.repeats} interleaved runs per variant "
            f"(memory adapter, Client.publish then no-op handler), "
            f"sample_ratio={self.sample_ratio}",
            f"{'':16}{'msgs/s':>12}{'min..max':>22}{'CPU us/msg':>12}{'consume CPU':>14}",
            row("uninstrumented", self.uninstrumented),
            row("telemetry off", self.off),
            row("telemetry on", self.on),
            *([row("/metrics only", self.metrics)] if self.metrics is not None else []),
            f"off / uninstrumented = {self.off_over_uninstrumented:.3f} ({verdict} the "
            f"uninstrumented runs' spread of {self.uninstrumented.spread:.1%})",
            f"on / off = {self.on_over_off:.3f}; spans exported per on run (OTLP/HTTP to "
            f"an endpoint in another process): {self.spans_exported}, lost in all on runs: "
            f"{self.spans_lost}",
            *([f"/metrics only / off = {self.metrics_over_off:.3f} (histogram per message, "
               f"rendered every {SCRAPE_EVERY_S}s)"] if self.metrics_over_off is not None
              else []),
            *self._consume_line(),
        ])

    def _consume_line(self) -> list[str]:
        on, metrics = self.consume_cpu_ratio(self.on), self.consume_cpu_ratio(self.metrics)
        if on is None:
            return []
        text = f"consume CPU, off / on = {on:.3f}"
        if metrics is not None:
            text += f"; off / /metrics only = {metrics:.3f}"
        return [text + " (the worker's share: 1.0 costs nothing)"]


def telemetry_cost(messages: int, repeats: int = 5, sample_ratio: float = 1.0) -> TelemetryCost:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(repeats):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            result = _run_in_subprocess(variant, messages, sample_ratio)
            want_hooks = [] if variant == "uninstrumented" else ["_traced", "publish_span",
                                                                  "telemetry"]
            if result["publish_hooks"] != want_hooks:
                raise BenchmarkError(
                    f"the {variant} run's Client.publish uses {result['publish_hooks']}, "
                    f"expected {want_hooks}: update strip_instrumentation() to the new hooks"
                )
            runs[variant].append(result)
    return TelemetryCost(
        messages, repeats, sample_ratio,
        Figure.of(runs["uninstrumented"]), Figure.of(runs["off"]), Figure.of(runs["on"]),
        runs["on"][-1]["spans_exported"], Figure.of(runs["metrics"]),
        sum(r["spans_lost"] for r in runs["on"]),
    )


if __name__ == "__main__":
    variant, n, ratio = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(run_variant(variant, n, ratio)))
