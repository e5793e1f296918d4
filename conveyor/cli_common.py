"""What the CLI's command modules share: loading the config and exiting as promised.

A bad config exits 2 naming the field, a user mistake found after parsing exits 2 in one
line, a failure of the run exits 1. ``conveyor.cli`` and the command modules registered
in it (``cli_dlq``) take them from here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import ConfigError, ConveyorError


def load_config_or_exit(path: Path | None,
                        overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load config or exit 2 with the field named (a bad config is a usage error)."""
    try:
        return load_config(path, overrides=overrides)
    except ConfigError as exc:
        click.echo(f"conveyor: config error: {exc}", err=True)
        sys.exit(2)


def fail(exc: ConveyorError) -> NoReturn:
    """Exit for an error raised after start-up: 2 for a config error, else 1."""
    if isinstance(exc, ConfigError):
        click.echo(f"conveyor: config error: {exc}", err=True)
        sys.exit(2)
    raise click.ClickException(str(exc)) from None


def usage(message: str) -> NoReturn:
    """A usage error found after start-up (the message names the argument): one line, exit 2."""
    click.echo(f"conveyor: {message}", err=True)
    sys.exit(2)
