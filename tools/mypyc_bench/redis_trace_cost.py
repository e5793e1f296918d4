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
separates the two paths' costs. Collection is
toggled on at the first delivery and off at the last acknowledgement, as in
``consume_cost.py``, so under

    SINK=http://127.0.0.1:PORT valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=X python redis_trace_cost.py on|off|parent N

X's total is the window only (all threads: the span exporter's too); the slope
between two N is the cost a message. Needs a Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import consume_cost  # the toggling clock (sets up callgrind control on import)

import conveyor.bench.timing as timing
from conveyor.bench.redis_throughput import RedisBackend
from conveyor.bench.shipped import Variant, bench_config
from conveyor.bench.throughput import _consume, _publish_into
from conveyor.bench.timing import bench_items


async def main(mode: str, n: int) -> None:
    tracing = (("telemetry.exporter", "otlp"),
               ("telemetry.sample_ratio", float(os.environ.get("RATIO", "0.1"))),
               ("telemetry.endpoint", os.environ["SINK"]))
    backend = RedisBackend("redis://127.0.0.1:6379/0")
    plain = backend.config(f"trace{os.getpid()}")
    where = {"redis.url": backend.url, "redis.prefix": plain.config.redis.prefix}
    traced = bench_config("redis", where, Variant(tracing))
    worker = traced if mode in ("on", "parent") else bench_config("redis", where, Variant(()))
    producer = traced if mode in ("parent", "parentoff") else plain
    await _publish_into(backend, producer, bench_items(n, 1000), False)
    timing.SteadyClock = consume_cost.ToggleClock  # type: ignore[misc]
    try:
        sample, _ = await _consume(worker, n)
    finally:
        await backend.cleanup(plain)
    print(f"{mode} {n} cpu_us_per_msg {sample.cpu_us_per_msg:.2f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
