"""End-to-end no-op throughput on the embedded adapter (configs/local.toml), next to its floors.

    python benchmarks/throughput.py [--messages N] [--streams S] [--repeats R] [--json]

Same as ``conveyor bench throughput --adapter memory``; see conveyor/bench/throughput.py.
"""

from __future__ import annotations

import sys

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "throughput", *sys.argv[1:]])
