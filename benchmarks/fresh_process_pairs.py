"""Consume CPU of the memory path, metrics off and on, each run in a fresh process.

``conveyor bench throughput`` runs every variant in one process, one after another, so
each run inherits the heap of those before it; a worker consumes from a fresh start.
Here each run is a process of its own: ``--messages`` published with
``Client.publish_batch`` over 1,000 streams (the bench's items), the startup heap frozen
as ``conveyor worker`` freezes it, then one daemon of the shipped ``local.toml``
defaults timed (CPU of the process, all threads) from its start until every message is
acknowledged. The two variants alternate (off, on, off, on, ...) ``--pairs`` times;
``--no-aslr`` runs each process under ``setarch -R`` (address-space randomization off),
which tells noise from where the heap lands apart from the rest.

    .venv/bin/python benchmarks/fresh_process_pairs.py [--pairs 5] [--messages 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.bench.throughput import AckCounter, noop_app
from conveyor.bench.timing import bench_items
from conveyor.client import Client
from conveyor.platform.config import Config, TelemetryConfig
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import WorkerDaemon

VARIANTS = ("off", "metrics")


async def one_run(variant: str, messages: int) -> float:
    """CPU µs a message of one daemon consuming ``messages``, metrics ``variant``."""
    counter = [0]
    reset_broker("pairs")
    adapter = MemoryAdapter("pairs")
    acks = AckCounter(adapter, messages)
    telemetry = Telemetry.prometheus_only(TelemetryConfig()) if variant == "metrics" else None
    daemon = WorkerDaemon(noop_app(counter), Config(), adapter=adapter, telemetry=telemetry)
    await Client(adapter, daemon.mapper).publish_batch(bench_items(messages, 1000))
    gc.freeze()
    started = time.process_time()
    await daemon.start()
    await asyncio.wait_for(acks.done.wait(), 600)
    cpu = time.process_time() - started
    await daemon.stop()
    assert counter[0] == messages, (counter[0], messages)
    return cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--no-aslr", action="store_true")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one_run(args.one, args.messages))))
        return
    prefix = ["setarch", "-R"] if args.no_aslr else []
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.pairs):
        for variant in VARIANTS:
            out = subprocess.run(
                [*prefix, sys.executable, __file__, "--one", variant,
                 "--messages", str(args.messages)],
                capture_output=True, text=True, check=True)
            runs[variant].append(json.loads(out.stdout))
    print(f"consume CPU µs a message, {args.messages:,} messages, each run in a fresh "
          f"process{' (ASLR off)' if args.no_aslr else ''}")
    for variant, values in runs.items():
        shown = " ".join(f"{v:.2f}" for v in values)
        print(f"  {variant:<8} median {statistics.median(values):.2f}  runs: {shown}")
    ratio = statistics.median(runs["off"]) / statistics.median(runs["metrics"])
    print(f"  off / metrics on (medians): {ratio:.3f}")


if __name__ == "__main__":
    main()
