"""Every Python block of README.md runs as printed.

The tour's blocks (after a ``<!-- tour: NAME -->`` line) are run in a worker by
tests/e2e/test_tour.py. The rest run here, each in a fresh namespace; the short ones
that begin with a handler declaration (``@app.handler(...)``) get the ``app`` and the
``Job`` type they assume. Declaring a handler checks its options, so a misspelt option
or an undecodable type in the README fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
PRELUDE = '''
import msgspec
import conveyor

app = conveyor.App("readme")

class Job(msgspec.Struct):
    id: str
'''


def python_blocks() -> list[tuple[int, str]]:
    text = README.read_text()
    blocks = []
    for m in re.finditer(r"(?P<before>[^\n]*)\n```python\n(?P<body>.*?)```", text, re.DOTALL):
        if not m["before"].startswith("<!-- tour:"):
            blocks.append((text.count("\n", 0, m.start("body")) + 1, m["body"]))
    return blocks


def test_the_readme_has_python_blocks_outside_the_tour() -> None:
    assert len(python_blocks()) >= 5


@pytest.mark.parametrize(("line", "body"), python_blocks(),
                         ids=[f"README.md:{line}" for line, _ in python_blocks()])
def test_a_readme_python_block_runs(line: int, body: str) -> None:
    source = PRELUDE + body if body.startswith("@app.") else body
    exec(compile(source, f"README.md:{line}", "exec"), {"__name__": f"readme_{line}"})


def test_readme_python_blocks_use_no_undefined_name(tmp_path: Path) -> None:
    """Running a block does not run its functions' bodies: pyflakes (through ruff) checks
    every name in them, e.g. an ``asyncio`` used in a method but never imported."""
    for line, body in python_blocks():
        source = PRELUDE + body if body.startswith("@app.") else body
        (tmp_path / f"readme_{line}.py").write_text(source)
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F821",
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
