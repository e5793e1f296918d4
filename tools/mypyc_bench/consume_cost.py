"""Per-message cost of the memory adapter's consume phase, as `conveyor bench throughput
--adapter memory` times it (shipped configs/local.toml, no-op handler, one daemon).

Reuses the bench's own code (publish_batch into a fresh broker, then time_daemon) with
the bench's SteadyClock swapped for one that also toggles callgrind collection on at the
first delivery and off when the last acknowledgement is in. So under

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=X \
        python consume_cost.py -n N

the Ir total in X is the timed window only. Natively it prints CPU µs/message (process_time)
per repeat. Run it with PYTHONPATH pointing at the tree to measure (pure or mypyc-built).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

_SRC = Path(__file__).with_name("cgctl.c")
# Named for its source, so that a library built from an older cgctl.c is not picked up.
_LIB = Path(os.environ.get(
    "CGCTL_SO", f"/tmp/cgctl-{hashlib.sha256(_SRC.read_bytes()).hexdigest()[:12]}.so"))


def _cg() -> tuple[object, bool]:
    if not _LIB.exists():
        os.system(f"gcc -O2 -shared -fPIC -o {_LIB} {_SRC}")
    lib = ctypes.CDLL(str(_LIB))
    return lib, bool(lib.cg_running())


CG, ON_VALGRIND = _cg()

import conveyor.bench.timing as timing  # noqa: E402
from conveyor.bench.throughput import (  # noqa: E402
    MemoryBackend,
    _consume,
    _publish_into,
    with_metrics_endpoint,
)
from conveyor.bench.timing import bench_items  # noqa: E402


class ToggleClock(timing.SteadyClock):
    def first(self) -> None:
        if self.started is None and ON_VALGRIND:
            CG.cg_toggle()  # type: ignore[attr-defined]
        super().first()

    def stop(self, messages: int) -> timing.Sample:
        if ON_VALGRIND and self.started is not None:
            CG.cg_toggle()  # type: ignore[attr-defined]
        return super().stop(messages)


_PLAIN = timing.SteadyClock


def compiled_modules() -> list[str]:
    return sorted(name for name, m in sys.modules.items()
                  if name.startswith("conveyor") and getattr(m, "__file__", "") and
                  m.__file__.endswith(".so"))


async def one(backend: MemoryBackend, n: int, streams: int, tag: str,
              metrics: bool = False) -> float:
    items = bench_items(n, streams)
    bench = backend.config(tag)
    if metrics:  # [http] port set, as the bench's metrics-on run
        bench = with_metrics_endpoint(bench)
    try:
        await _publish_into(backend, bench, items, False)
        timing.SteadyClock = ToggleClock  # type: ignore[misc]  # the daemon's clock only
        try:
            sample, _ = await _consume(bench, n)  # raises unless exactly n handled and acked
        finally:
            timing.SteadyClock = _PLAIN  # type: ignore[misc]
    finally:
        await backend.cleanup(bench)
    return sample.cpu_us_per_msg


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", "--messages", type=int, default=100_000)
    p.add_argument("-s", "--streams", type=int, default=1000)
    p.add_argument("-r", "--repeats", type=int, default=1)
    p.add_argument("--metrics", action="store_true", default=bool(os.environ.get("METRICS")),
                   help="with [http] port set (default from $METRICS)")
    args = p.parse_args()
    backend = MemoryBackend()
    cpu = [asyncio.run(one(backend, args.messages, args.streams, f"r{i}", args.metrics))
           for i in range(args.repeats)]
    print(json.dumps({"messages": args.messages, "repeats": args.repeats,
                      "cpu_us_per_msg": [round(c, 3) for c in cpu],
                      "cpu_us_per_msg_min": round(min(cpu), 3),
                      "cpu_us_per_msg_median": round(statistics.median(cpu), 3),
                      "compiled": compiled_modules()}))


if __name__ == "__main__":
    main()
