"""Stateless-worker pools after a burst: monotonic (Orleans' default) vs PID scale-down.

    python benchmarks/scale_down.py [--cycles N] [--cycle-s S] [--json]

Same as ``conveyor bench scale-down``; see conveyor/bench/scale_down.py.
"""

from __future__ import annotations

import sys

from conveyor.cli import main

if __name__ == "__main__":
    main(["bench", "scale-down", *sys.argv[1:]])
