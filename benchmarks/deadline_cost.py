"""Microseconds of CPU a use of each pull deadline costs, around a no-op coroutine, in
the same run: ``asyncio.timeout`` (the floor: what the kafka-group pull's bound used
before) and ``StallTolerantTimeout`` with a delay and with none (what a pull outside a
group pays); best of ``--repeats`` loops of ``--calls`` uses each.

    .venv/bin/python benchmarks/deadline_cost.py [--calls 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.platform.deadlines import StallTolerantTimeout


async def noop() -> None:
    return None


async def per_use_us(make: Callable[[], AbstractAsyncContextManager[Any]], calls: int,
                     repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            async with make():
                await noop()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    floor = await per_use_us(lambda: asyncio.timeout(1.5), args.calls, args.repeats)
    print(f"asyncio.timeout(1.5)          {floor:6.2f} us a use (floor)")
    for label, delay in (("StallTolerantTimeout(1.5)", 1.5), ("StallTolerantTimeout(None)", None)):
        cost = await per_use_us(lambda d=delay: StallTolerantTimeout(d),
                                args.calls, args.repeats)
        print(f"{label:29} {cost:6.2f} us a use, {cost / floor:.2f} of the floor")


if __name__ == "__main__":
    asyncio.run(main())
