"""Where the I/O-bound Kafka run's gap to the ideal slots / latency goes.

    .venv/bin/python benchmarks/kafka_io_breakdown.py [--bootstrap HOST:PORT]

The same workload as the I/O-bound figure of ``conveyor bench throughput --adapter
kafka`` (one partition, 1,000 keys, 100 slots, a handler that sleeps 5 ms), sampled
every millisecond while it runs: slots issued (a message pulled or being pulled), slots
in use (its handler started), handlers running, and what one ``asyncio.sleep(0.005)``
really took. Ideal = slots / 5 ms; what is reached ~ running / measured sleep. The
sampler itself costs a little, so the throughput here is a shade below the benchmark's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.bench.kafka_throughput import io_config, private_tansu
from conveyor.bench.throughput import build_messages
from conveyor.bench.timing import bench_items
from conveyor.platform.app import App
from conveyor.workers.daemon import WorkerDaemon

MESSAGES, KEYS, SLOTS, SLEEP_S = 20_000, 1_000, 100, 0.005


async def breakdown(bootstrap: str) -> None:
    app = App("bench-io")
    running, handled, slept, first = [0], [0], [], []
    done = asyncio.Event()

    @app.handler("bench")
    async def work(body: bytes) -> None:
        t0 = time.perf_counter()
        if not first:
            first.append(t0)
        running[0] += 1
        await asyncio.sleep(SLEEP_S)
        slept.append(time.perf_counter() - t0)
        running[0] -= 1
        handled[0] += 1
        if handled[0] == MESSAGES:
            done.set()

    daemon = WorkerDaemon(app, io_config(bootstrap, f"breakdown-{time.monotonic_ns()}", SLOTS))
    await daemon.adapter.enqueue(0, build_messages(bench_items(MESSAGES, KEYS), 1))
    samples: list[tuple[float, int, int, int]] = []

    async def sample() -> None:
        while not done.is_set():
            if first:
                samples.append((time.perf_counter(), daemon.slots.issued,
                                daemon.slots.in_use, running[0]))
            await asyncio.sleep(0.001)

    await daemon.start()
    sampler = asyncio.create_task(sample())
    try:
        await asyncio.wait_for(done.wait(), timeout=300)
        wall = time.perf_counter() - first[0]
    finally:
        await sampler
        await daemon.stop()
    # Time-weighted: each sample holds until the next (the loop may delay the sampler).
    weights = [b[0] - a[0] for a, b in itertools.pairwise(samples)]
    issued, in_use, run = (
        sum(w * s[i] for w, s in zip(weights, samples, strict=False)) / sum(weights)
        for i in (1, 2, 3)
    )
    sleep_ms = statistics.mean(slept) * 1e3
    print(f"slots {SLOTS}: issued {issued:.1f}, in use {in_use:.1f} "
          f"(pulled, not started — behind their key or not yet reached by a runner: "
          f"{issued - in_use:.1f}; "
          f"free, between a release and the next reservation {SLOTS - issued:.1f})")
    print(f"handlers running {run:.1f}; asyncio.sleep(0.005) took {sleep_ms:.3f} ms on average")
    print(f"reached {MESSAGES / wall:,.0f} msgs/s (first call to last); running / sleep = "
          f"{run / sleep_ms * 1e3:,.0f}; ideal {SLOTS / SLEEP_S:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(breakdown(args.bootstrap))
    else:
        with private_tansu() as bootstrap:
            asyncio.run(breakdown(bootstrap))


if __name__ == "__main__":
    main()
