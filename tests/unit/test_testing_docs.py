"""docs/testing.md shows what is tested: its example files are the files ``make test``
runs, its script prints what the page says, and every Python block is one of those or a
fragment that compiles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "testing.md"
BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*) -->\n)?```python\n(?P<body>.*?)```"
                   r"(?:\n\n```text\n(?P<output>.*?)```)?", re.DOTALL)


def blocks() -> list[tuple[str, str, str | None]]:
    return [(m["mark"] or "", m["body"], m["output"]) for m in BLOCK.finditer(PAGE.read_text())]


def test_every_python_block_is_marked_as_a_file_a_script_or_a_fragment() -> None:
    marks = [mark.split(":")[0] for mark, _, _ in blocks()]
    assert marks and set(marks) <= {"file", "run", "fragment"}, marks
    assert marks.count("file") == 2 and marks.count("run") == 1


def test_the_example_files_shown_are_the_files_make_test_runs() -> None:
    shown = {mark.split(":", 1)[1].strip(): body for mark, body, _ in blocks()
             if mark.startswith("file:")}
    assert sorted(shown) == ["examples/bookshop/app.py", "examples/bookshop/test_app.py"]
    for path, body in shown.items():
        assert body == (REPO / path).read_text(), f"docs/testing.md shows an old {path}"


def test_the_script_prints_what_the_page_shows() -> None:
    [(script, output)] = [(body, out) for mark, body, out in blocks() if mark.startswith("run")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env=env, check=True)
    assert ran.stdout == output


def test_the_fragments_compile() -> None:
    for mark, body, _ in blocks():
        if mark == "fragment":
            compile(body, "docs/testing.md", "exec")
