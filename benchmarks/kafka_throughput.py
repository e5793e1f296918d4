"""Kafka no-op throughput as configs/kafka.toml ships, next to raw aiokafka loops, and
the I/O-bound concurrency run.

    .venv/bin/python benchmarks/kafka_throughput.py [--bootstrap HOST:PORT] [--messages N]
                                          [--slots N] [--set SECTION.FIELD=VALUE] [--json]

Same as ``conveyor bench throughput --adapter kafka``; see conveyor/bench/kafka_throughput.py
for what is timed. Without --bootstrap a private tansu broker (memory storage) is started.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "throughput", "--adapter", "kafka", *sys.argv[1:]])
