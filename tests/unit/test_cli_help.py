"""Every command's --help: an example that parses as the command's own options (so it
cannot rot), 80 columns at most; the main help lists commands by task, worker first."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from conveyor.cli import main
from conveyor.cli.common import SECTIONS

ROOT = Path(__file__).resolve().parents[2]


def commands(cmd: click.Command = main, parent: click.Context | None = None,
             name: str = "conveyor") -> Iterator[tuple[click.Context, click.Command]]:
    """(context, command) of the main command and every subcommand, depth first."""
    ctx = click.Context(cmd, info_name=name, parent=parent, terminal_width=80,
                        max_content_width=80)
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for sub in cmd.list_commands(ctx):
            found = cmd.get_command(ctx, sub)
            assert found is not None
            yield from commands(found, ctx, sub)


ALL = list(commands())


def examples(help_text: str) -> list[str]:
    """The command lines of the ``Examples:`` block, continuation lines joined."""
    block = re.split(r"\n  Examples?:\n", help_text, maxsplit=1)[1:]
    assert block, "no Examples: block"
    lines: list[str] = []
    for line in block[0].splitlines():
        if not line.startswith("    "):
            break
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + line.strip()
        else:
            lines.append(line.strip())
    return lines


def parse(argv: list[str]) -> click.Context:
    """Parse ``argv`` (after ``conveyor``) down to the command it names, as click would
    before running it: unknown options, bad values and missing arguments raise."""
    cmd: click.Command = main
    name = "conveyor"
    parent = None
    while isinstance(cmd, click.Group) and argv and not argv[0].startswith("-"):
        ctx = click.Context(cmd, info_name=name, parent=parent)
        sub = cmd.get_command(ctx, argv[0])
        assert sub is not None, f"no command {argv[0]!r} under {name!r}"
        cmd, name, parent, argv = sub, argv[0], ctx, argv[1:]
    return cmd.make_context(name, argv, parent=parent)


@pytest.mark.parametrize(("ctx", "cmd"), ALL, ids=[c.command_path for c, _ in ALL])
def test_each_help_has_an_example_that_parses_and_fits_80_columns(
    ctx: click.Context, cmd: click.Command, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the examples name configs/ files, which must exist
    text = cmd.get_help(ctx)
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)
    assert "``" not in text, "reST markup in a help a terminal shows as it is"
    found = examples(text)
    assert found
    for line in found:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "conveyor", line
        parsed = parse(argv[1:])
        assert parsed.command_path.startswith(ctx.command_path), (line, parsed.command_path)


def test_the_main_help_lists_commands_by_task_worker_first() -> None:
    ctx = ALL[0][0]
    text = main.get_help(ctx)
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":")
                and not line.startswith(" ")]
    assert headings == ["Options", *SECTIONS.values()], headings
    listed = main.list_commands(ctx)
    assert listed[0] == "worker"
    assert all(main.get_command(ctx, name) for name in listed)
    assert set(listed) == set(main.commands)  # none left out of a section
    run = text.split("\nRun:\n", 1)[1].splitlines()[0]
    assert run.split()[0] == "worker"
    assert "..." not in text.split("\nRun:\n", 1)[1], "a command's one-liner was cut"


GROUPS = [(ctx, cmd) for ctx, cmd in ALL if isinstance(cmd, click.Group)]


@pytest.mark.parametrize(("ctx", "cmd"), GROUPS, ids=[c.command_path for c, _ in GROUPS])
def test_a_groups_help_lists_each_command_with_its_whole_one_liner(
    ctx: click.Context, cmd: click.Group
) -> None:
    """click cuts a one-liner that does not fit 80 columns with '...' (its width is 80 at
    most, whatever the terminal's): ``short_help=`` gives a long first sentence a short
    one."""
    cut = [line for line in cmd.get_help(ctx).splitlines()
           if line.startswith("  ") and line.rstrip().endswith("...")]
    assert not cut, "\n".join(cut)
