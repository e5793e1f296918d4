"""Nanoseconds per CDM-KF update next to a plain assignment loop, in the same run.

Mirrors the reference's benchmark (1,000 measurements of a sine, assigned vs filtered
then assigned). Prints both figures and their ratio. Timings on a shared machine are
noisy: the best of several repeats is reported.

    .venv/bin/python benchmarks/kalman.py [--samples 1000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.platform.balancing.kalman import CDMKalmanFilter


def assign(values: list[float], measurements: list[float]) -> None:
    for i in range(len(measurements)):
        values[i] = measurements[i]


def filter_then_assign(
    flt: CDMKalmanFilter, values: list[float], measurements: list[float]
) -> None:
    update = flt.update
    for i in range(len(measurements)):
        values[i] = update(measurements[i])


def best_ns(fn: object, repeats: int, samples: int, *args: object) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn(*args)  # type: ignore[operator]
        best = min(best, time.perf_counter_ns() - start)
    return best / samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    measurements = [math.sin(0.1 * i) * 100.0 for i in range(args.samples)]
    values = [0.0] * args.samples
    flt = CDMKalmanFilter()
    assign_ns = best_ns(assign, args.repeats, args.samples, values, measurements)
    filter_ns = best_ns(filter_then_assign, args.repeats, args.samples, flt, values, measurements)
    print(f"samples per run: {args.samples}, best of {args.repeats} runs")
    print(f"assign only:          {assign_ns:8.1f} ns/sample")
    print(f"CDM-KF then assign:   {filter_ns:8.1f} ns/sample")
    print(f"ratio:                {filter_ns / assign_ns:8.1f}x")
    print(f"CDM-KF alone (diff):  {filter_ns - assign_ns:8.1f} ns/update")


if __name__ == "__main__":
    main()
