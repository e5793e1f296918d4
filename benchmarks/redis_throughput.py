"""Redis no-op throughput as configs/redis.toml ships, next to raw redis-py loops.

    .venv/bin/python benchmarks/redis_throughput.py [--redis-url URL] [--messages N] [--daemons 2]
                                          [--slots N] [--set SECTION.FIELD=VALUE] [--json]

Same as ``conveyor bench throughput --adapter redis``; see conveyor/bench/redis_throughput.py
for what is timed. Without --redis-url a private redis-server is started on a free port.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "throughput", "--adapter", "redis", *sys.argv[1:]])
