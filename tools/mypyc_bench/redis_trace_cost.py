"""What tracing at a 10 % sampler costs a worker on Redis, in instructions (callgrind).

The Redis bench's consume window (shipped ``configs/redis.toml``, one daemon, no-op
handler, 1,000 streams), with ``[telemetry]`` off or ``exporter = "otlp"``,
``sample_ratio = 0.1`` to an OTLP endpoint (``$SINK``: start one with
``python -m conveyor.bench.otlp_sink``). The messages are published first by a client
without telemetry, as a producer in another process: no ``traceparent``, so the worker
decides each new trace (9 in 10 dropped, 1 in 10 a lean span exported). ``parent``:
tracing on, and the producer traces too (every message carries a ``traceparent``; the
worker follows its decision); ``parentoff``: the producer traces, the worker does not
(what carrying the header costs a worker alone). ``RATIO`` in the environment sets the
sampler (default 0.1): at 0 every trace is dropped, at 1 every one kept, which
separates the two paths' costs. Instrumentation is
turned on at the first delivery and off at the last acknowledgement (where
``consume_cost.py`` toggles collection), so under

    SINK=http://127.0.0.1:PORT REDIS_URL=redis://127.0.0.1:RPORT/0 \\
        valgrind --tool=callgrind --instr-atstart=no \\
        --callgrind-out-file=X python redis_trace_cost.py on|off|parent N

X's total is the window only, every thread's: the span recorder's export thread
(joining a batch, posting it) as well as the event loop's. (Collection toggled with
``--collect-atstart=no``, as ``consume_cost.py`` does, would count the event loop's
thread alone: callgrind keeps that switch per thread.) Spans still queued when the
window closes are posted outside it, at most a batch's worth at any N: the slope
between two N is the cost a message. ``$REDIS_URL`` is the Redis to use (default
``redis://127.0.0.1:6379/0``). ``LEASE_S`` (e.g. 120) lengthens the lease and the
membership's time-to-live for both runs, so that no lease lapses under valgrind.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import consume_cost  # callgrind's client requests (set up on import)

import conveyor.bench.timing as timing
from conveyor.bench.redis_throughput import RedisBackend
from conveyor.bench.shipped import Variant, bench_config
from conveyor.bench.throughput import _consume, _publish_into
from conveyor.bench.timing import bench_items


class InstrumentClock(timing.SteadyClock):
    """The bench's clock, instrumenting every thread (callgrind) while it runs."""

    def first(self) -> None:
        if self.started is None and consume_cost.ON_VALGRIND:
            consume_cost.CG.cg_instrument(1)  # type: ignore[attr-defined]
        super().first()

    def stop(self, messages: int) -> timing.Sample:
        if consume_cost.ON_VALGRIND and self.started is not None:
            consume_cost.CG.cg_instrument(0)  # type: ignore[attr-defined]
        return super().stop(messages)


async def main(mode: str, n: int) -> None:
    tracing = (("telemetry.exporter", "otlp"),
               ("telemetry.sample_ratio", float(os.environ.get("RATIO", "0.1"))),
               ("telemetry.endpoint", os.environ["SINK"]))
    backend = RedisBackend(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    plain = backend.config(f"trace{os.getpid()}")
    where = {"redis.url": backend.url, "redis.prefix": plain.config.redis.prefix}
    # Under valgrind the worker runs some 50 times slower: with the shipped lease (5 s)
    # and membership (3 s) its leases lapse and its queues move mid-window, work the
    # count then includes. LEASE_S (seconds, off and on alike) keeps them.
    lease = os.environ.get("LEASE_S")
    slow = () if lease is None else (("balancer.lease_ttl_s", float(lease)),
                                     ("redis.member_ttl_s", float(lease)))
    traced = bench_config("redis", where, Variant(tracing + slow))
    worker = traced if mode in ("on", "parent") else bench_config("redis", where, Variant(slow))
    producer = traced if mode in ("parent", "parentoff") else plain
    await _publish_into(backend, producer, bench_items(n, 1000), False)
    timing.SteadyClock = InstrumentClock  # type: ignore[misc]
    try:
        sample, _ = await _consume(worker, n)
    finally:
        await backend.cleanup(plain)
    print(f"{mode} {n} cpu_us_per_msg {sample.cpu_us_per_msg:.2f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
