"""The scripts under benchmarks/ run as the docs print them, ``.venv/bin/python
benchmarks/NAME.py``, from any directory: each imports the conveyor of its own checkout
(not whichever one the interpreter has installed, nor none)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if "\nfrom conveyor" in p.read_text())
PROBE = """
import runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
import conveyor
print(conveyor.__file__)
"""


def test_there_are_scripts_that_import_conveyor() -> None:
    assert len(SCRIPTS) >= 7


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_a_benchmark_script_runs_from_anywhere_on_this_checkouts_conveyor(
    script: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", PROBE, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.splitlines()[-1]).is_relative_to(ROOT / "conveyor")
