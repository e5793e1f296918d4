"""Every code block of README.md and docs/*.md is checked (tests/docs_blocks.py says how
blocks are marked).

Here: Python blocks run, each in a fresh namespace (the short ones that begin with a
handler declaration, ``@app.handler(...)``, get the ``app`` and the ``Job`` type they
assume, and declaring a handler checks its options, so a misspelt option or an
undecodable type fails here); TOML blocks decode as a Conveyor config; JSON and YAML
blocks parse; every ``conveyor`` command of an illustrative block is one the CLI
accepts. Shell blocks run in tests/e2e/test_docs_console.py, the tour in
tests/e2e/test_tour.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import msgspec
import pytest
import yaml
from click.testing import CliRunner

import conveyor
from conveyor.cli import main as cli
from tests.docs_blocks import SHELL, TEXT, Block, all_blocks, blocks, doc_files, shell_commands

PRELUDE = '''
import msgspec
import conveyor

app = conveyor.App("readme")

class Job(msgspec.Struct):
    id: str
'''
# Blocks that only show what a reader would run elsewhere (Docker, Kubernetes, a cluster,
# their own app's state). Each is counted here so that more of them is a decision.
MOST_ILLUSTRATIVE = 18


def ids(found: list[Block]) -> list[str]:
    return [block.where for block in found]


def source(block: Block) -> str:
    return PRELUDE + block.body if block.body.startswith("@app.") else block.body


PYTHON = blocks({"python"}, {""})
TOML = blocks({"toml"}, {""})
DATA = blocks({"json", "yaml"}, {""})
ILLUSTRATIVE = blocks(SHELL | {"python", "toml"}, {"illustrative"})


def test_every_block_is_of_a_language_the_tests_check_or_is_text() -> None:
    known = {"python", "toml", "json", "yaml"} | SHELL | TEXT
    assert [b.where for b in all_blocks() if b.lang not in known] == []
    assert [b.where for b in all_blocks()
            if b.marker not in {"", "tour", "redis", "illustrative", "own"}] == []


def test_there_are_blocks_of_each_kind_and_few_illustrative_ones() -> None:
    assert len(PYTHON) >= 6 and len(TOML) >= 8 and DATA
    assert 0 < len(ILLUSTRATIVE) <= MOST_ILLUSTRATIVE, ids(ILLUSTRATIVE)


@pytest.mark.parametrize("block", PYTHON, ids=ids(PYTHON))
def test_a_python_block_runs(block: Block) -> None:
    exec(compile(source(block), block.where, "exec"), {"__name__": f"docs_{block.line}"})


def test_python_blocks_use_no_undefined_name(tmp_path: Path) -> None:
    """Running a block does not run its functions' bodies: pyflakes (through ruff) checks
    every name in them, e.g. an ``asyncio`` used in a method but never imported."""
    for n, block in enumerate(blocks({"python"}, {"", "redis", "tour"})):
        (tmp_path / f"block_{n}.py").write_text(f"# {block.where}\n" + source(block))
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F821",
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("block", TOML, ids=ids(TOML))
def test_a_toml_block_is_a_config_every_field_of_which_exists(block: Block) -> None:
    """A fragment: each section and field must exist and be well typed (cross-field
    checks, which need a whole config, are left to the shipped configs' tests)."""
    raw = tomllib.loads(block.body)
    msgspec.convert(raw, conveyor.Config, strict=False)


@pytest.mark.parametrize("block", DATA, ids=ids(DATA))
def test_a_json_or_yaml_block_parses(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.body)
    else:
        assert yaml.safe_load(block.body) is not None


def conveyor_argv(command: str) -> list[str] | None:
    """The arguments of a ``conveyor`` (or ``.venv/bin/conveyor``) command, else None."""
    words = shlex.split(command, comments=True)
    if not words or words[0] not in {"conveyor", ".venv/bin/conveyor"}:
        return None
    return words[1:]


ILLUSTRATED_COMMANDS = [
    (block, argv) for block in ILLUSTRATIVE if block.lang in SHELL
    for command in shell_commands(block) if (argv := conveyor_argv(command)) is not None
]


def test_illustrative_blocks_show_conveyor_commands() -> None:
    assert len(ILLUSTRATED_COMMANDS) >= 10


@pytest.mark.parametrize(("block", "argv"), ILLUSTRATED_COMMANDS,
                         ids=[f"{b.where}:{' '.join(a[:2])}" for b, a in ILLUSTRATED_COMMANDS])
def test_an_illustrated_conveyor_command_is_one_the_cli_accepts(
    block: Block, argv: list[str]
) -> None:
    """``--help`` after the arguments: click resolves every subcommand and rejects an
    unknown option before it prints the help, without running anything."""
    result = CliRunner().invoke(cli, [*argv, "--help"])
    assert result.exit_code == 0, f"{block.where}: conveyor {shlex.join(argv)}\n{result.output}"


def test_the_cli_check_refuses_an_unknown_command_or_option() -> None:
    assert CliRunner().invoke(cli, ["dlq", "list", "--no-such-option", "--help"]).exit_code == 2
    assert CliRunner().invoke(cli, ["no-such-command", "--help"]).exit_code == 2


# -- every `conveyor …` the docs name, in prose, tables and synopses -------------------
# Subcommands the README names before they land (`conveyor dev kafka`, `conveyor asyncapi`:
# work in flight); once they exist they are checked like the rest, so empty this then.
NOT_YET_COMMANDS: set[str] = set()


def named_commands() -> list[tuple[str, str]]:
    """``(file, command)`` for every ``conveyor …`` code span and synopsis line."""
    found = []
    for path in doc_files():
        text = path.read_text()
        found += [(path.name, m[1]) for m in
                  re.finditer(r"`((?:\.venv/bin/)?conveyor [^`]+)`", text)]
        found += [(path.name, line.strip().removeprefix("$ ")) for line in text.splitlines()
                  if line.strip().removeprefix("$ ").startswith(("conveyor ",
                                                                 ".venv/bin/conveyor "))]
    return found


def unknown_in(command: str) -> list[str]:
    """The subcommand or the options of ``command`` the CLI does not have."""
    words = command.split()[1:]
    while words[:1] == ["--log-level"]:
        words = words[2:]
    cmd: click.Command = cli
    while words and isinstance(cmd, click.Group) and (
            sub := cmd.get_command(click.Context(cmd), words[0])) is not None:
        cmd = sub
        words.pop(0)
    if (words and isinstance(cmd, click.Group) and re.fullmatch(r"[a-z][a-z-]*", words[0])
            and words[0] not in NOT_YET_COMMANDS):
        return [words[0]]
    options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command))
    return sorted(named - options - {"--log-level"})


def test_every_command_and_option_the_docs_name_exists() -> None:
    commands = named_commands()
    assert len(commands) > 100
    assert [(where, command, bad) for where, command in commands
            if (bad := unknown_in(command))] == []


def reference_rows() -> list[str]:
    """Every ``conveyor …`` a row of docs/commands.md's table starts with or names."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "commands.md").read_text()
    return [m[1] for line in text.splitlines() if line.startswith("| `conveyor ")
            for m in re.finditer(r"`(conveyor [^`]+)`", line.split(" | ")[0])]


def unlisted_commands(group: click.Group, rows: list[str], path: str = "conveyor") -> list[str]:
    """The commands of ``group`` no row names; a group with a row ``conveyor NAME …``
    has its subcommands listed where that row points (``conveyor sim …``)."""
    missing = []
    for name, command in group.commands.items():
        here = f"{path} {name}"
        if isinstance(command, click.Group) and f"{here} …" not in rows:
            missing += unlisted_commands(command, rows, here)
        elif not any(row == here or row.startswith(f"{here} ")
                     for row in rows):
            missing.append(here)
    return missing


def test_the_command_reference_has_a_row_for_every_command() -> None:
    # "Every command, its options and what it prints": a command added to the CLI is
    # added to docs/commands.md too (configs, dev, asyncapi and console were missing).
    rows = reference_rows()
    assert len(rows) > 15
    assert unlisted_commands(cli, rows) == []


def test_the_command_check_finds_an_unknown_subcommand_or_option() -> None:
    assert unknown_in("conveyor dlq lst --app shop") == ["lst"]
    assert unknown_in("conveyor status --app shop --watchh 2") == ["--watchh"]
    assert unknown_in("conveyor --log-level warning worker shop:app --config x") == []
