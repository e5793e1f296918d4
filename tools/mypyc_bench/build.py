"""Build (or clean) a mypyc subset of Conveyor in place: .so files next to the .py files.

    python tools/mypyc_bench/build.py SUBSET   # a name in SUBSETS, or a comma list of paths
    python tools/mypyc_bench/build.py --clean

Runs mypycify + build_ext --inplace (-j 2) from the repo root. The repo's pyproject.toml has
an SPDX ``license = "..."`` string that the venv's setuptools 65 rejects: put a newer
setuptools first on PYTHONPATH (pip install --target /tmp/st 'setuptools>=77').
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
D = "conveyor/platform/delivery/"
CORE = ["conveyor/platform/agent.py", "conveyor/platform/queue_cache.py",
        "conveyor/platform/acks.py"]
SLOTS = ["conveyor/platform/slots.py", "conveyor/workers/slots/fixed.py"]
CHAIN = [D + "__init__.py", D + "chain.py", D + "dead_letter.py"]
SUBSETS = {
    "agent": ["conveyor/platform/agent.py"],
    "core": CORE,
    "core+slots": [*CORE, *SLOTS],
    "core+delivery": CORE + [D + m for m in ("__init__.py", "chain.py", "dead_letter.py")],
    # core+delivery+slots: the largest subset that passes the unit tests touching it
    # (but for one __qualname__ introspection) and does not crash.
    "safe": [*CORE, *SLOTS, *CHAIN],
    # fast = safe + ownership + watchdog; measured with mypyc-source-changes.patch applied
    # (Entry/Lane as plain slotted classes, watchdog's _thread renamed: see README.md).
    "fast": [*CORE, *SLOTS, *CHAIN, "conveyor/platform/ownership.py",
             "conveyor/platform/watchdog.py"],
    # hot = safe + adapters/memory.py: runs the bench, but segfaults in the GC in the unit
    # tests (interpreted subclasses of MemoryReceiver/MemoryAdapter, allowed with
    # @mypyc_attr(allow_interpreted_subclasses=True)); without it they cannot subclass.
    "hot": [*CORE, *SLOTS, *CHAIN, "conveyor/adapters/memory.py"],
    "all": CORE + ["conveyor/platform/slots.py", "conveyor/workers/slots/fixed.py",
                   "conveyor/platform/message.py", "conveyor/adapters/memory.py"]
           + [D + m for m in ("__init__.py", "batch.py", "chain.py", "dead_letter.py",
                              "metrics.py", "orphans.py", "retry.py", "tracing.py")],
    # excluded: delivery/idempotency.py (class attribute without ClassVar: mypyc error),
    # platform/histograms.py (mypyc crash: text signature of f(self, a, b=1, **kw)).
}


def clean() -> None:
    for so in [*ROOT.glob("conveyor/**/*.so"), *ROOT.glob("*__mypyc*.so")]:
        so.unlink()
    shutil.rmtree(ROOT / "build", ignore_errors=True)


def main() -> None:
    os.chdir(ROOT)
    clean()
    if sys.argv[1] == "--clean":
        return
    paths = SUBSETS.get(sys.argv[1]) or sys.argv[1].split(",")
    from mypyc.build import mypycify
    from setuptools import setup

    t0 = time.perf_counter()
    ext = mypycify(paths, opt_level="3", debug_level="1")
    t1 = time.perf_counter()
    setup(name="conveyor_mypyc", ext_modules=ext,
          script_args=["build_ext", "--inplace", "-j", "2", "-q"])
    t2 = time.perf_counter()
    print(f"BUILD {sys.argv[1]}: {len(paths)} modules, mypy+codegen {t1 - t0:.1f} s, "
          f"C compile+link {t2 - t1:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
