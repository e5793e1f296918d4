"""The dead-zone table of docs/lab.md: shipped gains, seed 0, all seven patterns.

Average workers (and workers created) for the static pool and dynamic ones with dead
zones of 2 (shipped), 11 (the reference's, back-off 0), 1 and 4, with the idle
keep-alive as shipped (5 s) unless ``--keepalive`` says otherwise::

    .venv/bin/python benchmarks/dead_zone_table.py [--keepalive 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.lab.patterns import PATTERNS, generate
from conveyor.lab.sim import SimConfig, SimTrace, simulate
from conveyor.platform.options import ScaleDownPolicy

GAINS = (0.433, 0.468, 0.480)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keepalive", type=float, default=ScaleDownPolicy().idle_keepalive_s)
    keepalive = parser.parse_args().keepalive
    print("| pattern | static workers | dz 2 (shipped) workers | dz 11 (reference) workers "
          "| dz 1 workers | dz 4 workers | static created | dz 2 created | dz 11 created "
          "| avg queue dz 2 / 11 / 1 / 4 |")
    print("| --- |" + " ---: |" * 8 + " --- |")
    for pattern in PATTERNS:
        arrivals = generate(pattern, seed=0, duration_s=60.0)

        def run(dead_zone: int, backoff_s: float = 0.5,
                arrivals: Any = arrivals) -> SimTrace:
            policy = ScaleDownPolicy(dead_zone_cycles=dead_zone, backoff_s=backoff_s,
                                     idle_keepalive_s=keepalive)
            (trace,) = simulate(arrivals, SimConfig(duration_s=60.0, policy=policy), [GAINS])
            return trace

        (static,) = simulate(arrivals, SimConfig(duration_s=60.0), None)
        dz2, dz11, dz1, dz4 = run(2), run(11, 0.0), run(1), run(4)
        queues = " / ".join(f"{t.avg_queue_length:.3f}" for t in (dz2, dz11, dz1, dz4))
        print(f"| {pattern} | {static.avg_workers:.2f} | {dz2.avg_workers:.2f} "
              f"| {dz11.avg_workers:.2f} | {dz1.avg_workers:.2f} | {dz4.avg_workers:.2f} "
              f"| {int(static.created.sum())} | {int(dz2.created.sum())} "
              f"| {int(dz11.created.sum())} | {queues} |")


if __name__ == "__main__":
    main()
