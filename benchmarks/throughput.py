"""End-to-end no-op throughput on the embedded adapter (configs/local.toml), next to its floors.

    .venv/bin/python benchmarks/throughput.py [--messages N] [--streams S] [--repeats R] [--json]

Same as ``conveyor bench throughput --adapter memory``; see conveyor/bench/throughput.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "throughput", *sys.argv[1:]])
