"""``conveyor asyncapi``: write the AsyncAPI 3.0 document of an app.

Thin: the document is built by :mod:`conveyor.asyncapi`. Registered in :mod:`conveyor.cli`
with one line.
"""

from __future__ import annotations

from pathlib import Path

import click

from conveyor.cli.common import FilePath, load_config_or_exit
from conveyor.platform.errors import ConveyorError


def _api_version(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--api-version: an empty or blank one wrote a document whose ``info.version`` says
    nothing (the AsyncAPI schema takes any string)."""
    if not value.strip():
        raise click.BadParameter("an empty or blank version names none (e.g. 1.0.0)")
    return value


@click.command("asyncapi")
@click.argument("app_path")
@click.option("--config", "config_path",
              type=FilePath(exists=True, dir_okay=False, path_type=Path),
              help="TOML config of the app (servers, topic or key prefix, queues). "
                   "Defaults: the embedded memory adapter (no servers).")
@click.option("-o", "--output", type=FilePath(dir_okay=False, writable=True, path_type=Path),
              default=None, help="Write to this file instead of standard output.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="Default: json for an -o file ending in .json, else yaml.")
@click.option("--api-version", default="1.0.0", show_default=True, callback=_api_version,
              help="info.version of the document: the version of your app's API "
                   "(not empty).")
def asyncapi(app_path: str, config_path: Path | None, output: Path | None, fmt: str | None,
             api_version: str) -> None:
    """Write an AsyncAPI 3.0 document of an app.

    APP_PATH is MODULE:ATTR or FILE.py:ATTR. One channel per namespace the app
    handles, message schemas from the handlers' types, the wire format's headers and
    the broker bindings (Kafka topic, Redis streams) of --config. Nothing is asked of
    the broker.

    \b
    Example:
      conveyor asyncapi myapp:app --config configs/redis.toml -o asyncapi.yaml
    """
    from conveyor.asyncapi import asyncapi_document, dump
    from conveyor.loader import load_app

    config = load_config_or_exit(config_path)
    try:
        app = load_app(app_path)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="APP_PATH") from None
    if fmt is None:
        fmt = "json" if output is not None and output.suffix == ".json" else "yaml"
    text = dump(asyncapi_document(app, config, api_version=api_version), fmt)
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text)
        except OSError as exc:  # a user's path: one line, not a traceback
            raise click.BadParameter(f"cannot write {output}: {exc.strerror or exc}",
                                     param_hint="--output") from None
