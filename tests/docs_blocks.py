"""The code blocks of README.md and docs/*.md, as the docs tests read them.

A block is a fenced code block; the line right above it may carry a marker comment:

- ``<!-- tour: NAME -->`` — a README tour block, run by tests/e2e/test_tour.py;
- ``<!-- docs: redis -->`` — run against a redis-server of its own
  (``CONVEYOR_REDIS__URL`` points the shipped configs at it);
- ``<!-- docs: illustrative (why) -->`` — not run (it needs Docker, a cluster or a
  reader's own state); every ``conveyor`` command in it is still checked against the CLI.
  ``<!-- fragment -->`` says the same of a piece of code;
- ``<!-- runnable… -->``, ``<!-- run: … -->``, ``<!-- file: PATH -->`` — run by the
  tests of the page's own subject (the testing kit's examples, the AsyncAPI command…),
  so not run again here.

Without a marker a block is checked by its language: ``python`` runs, ``toml`` decodes
as a config, ``json`` / ``yaml`` parse, ``console`` / ``sh`` / ``bash`` run
(tests/unit/test_docs_blocks.py, tests/e2e/test_docs_console.py).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```$",
                    re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"^<!-- (?P<word>[\w-]+)(?::\s*(?P<value>[^\s>]+))?")
# What each marker word makes of a block (``docs:`` takes the word after it).
_KINDS = {"tour": "tour", "fragment": "illustrative", "runnable": "own", "run": "own",
          "file": "own"}

SHELL = {"console", "sh", "bash"}
# Languages that are not code to run: text (diagrams, synopses, sample output), Lua
# scripts quoted from the adapters, a Dockerfile (parsed by tests/unit/test_dockerfile.py).
TEXT = {"", "text", "lua", "dockerfile"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the block's first line of code
    lang: str
    body: str
    marker: str = ""  # "tour", "redis", "illustrative", "own" or ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in _FENCE.finditer(text):
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = _MARKER.match(above)
        kind = "" if marker is None else (
            marker["value"] or "" if marker["word"] == "docs" else _KINDS.get(marker["word"], ""))
        body = textwrap.dedent(m["body"]) if m["indent"] else m["body"]
        found.append(Block(path, text.count("\n", 0, m.start("body")) + 1, m["lang"], body,
                           kind))
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks_of(path)]


def blocks(lang: set[str], marker: set[str]) -> list[Block]:
    return [b for b in all_blocks() if b.lang in lang and b.marker in marker]


@dataclass
class Step:
    command: str
    output: list[str]


def console_steps(body: str) -> list[Step]:
    """A console block's ``$ command`` lines (a trailing ``\\`` continues one onto the
    next line), each with the output lines shown under it."""
    steps: list[Step] = []
    continued = False
    for line in body.splitlines():
        if continued:
            steps[-1].command = steps[-1].command[:-1].rstrip() + " " + line.strip()
        elif line.startswith("$ "):
            steps.append(Step(line[2:], []))
        else:
            steps[-1].output.append(line)
        continued = steps[-1].command.endswith("\\") and not steps[-1].output
    return steps


def shell_commands(block: Block) -> list[str]:
    """The commands of a shell block: a console block's, or an sh block's lines (joined
    where a line ends in ``\\``; comments and blank lines left out)."""
    if block.lang == "console":
        return [step.command for step in console_steps(block.body)]
    joined = block.body.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]
