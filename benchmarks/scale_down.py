"""Stateless-worker pools after a burst: monotonic (Orleans' default) vs PID scale-down.

    .venv/bin/python benchmarks/scale_down.py [--cycles N] [--cycle-s S] [--json]

Same as ``conveyor bench scale-down``; see conveyor/bench/scale_down.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "scale-down", *sys.argv[1:]])
