"""``conveyor configs``: the ready TOML configs that ship with Conveyor — list, print, copy.

Where they are: :mod:`conveyor.platform.config.shipped` (installed with the package, or
a checkout's ``configs/``); ``conveyor configs --copy configs`` puts them where the
documentation's commands expect them (``configs/redis.toml``). Registered in
:mod:`conveyor.cli` with one line.
"""

from __future__ import annotations

from pathlib import Path

import click

from conveyor.cli.common import FilePath
from conveyor.platform.config.shipped import shipped_configs, shipped_configs_dir


def _summary(path: Path) -> str:
    """The first comment line of a config: what it is for."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("# ").strip()
    return ""


@click.command("configs")
@click.argument("name", required=False)
@click.option("--copy", "copy_to", type=FilePath(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Write every shipped config into DIR (created if absent); an existing "
                   "file is left alone.")
def configs(name: str | None, copy_to: Path | None) -> None:
    """The configs that ship with Conveyor: list, print one, copy all.

    \b
    Examples:
      conveyor configs                  # the names and what each is for
      conveyor configs redis            # print configs/redis.toml
      conveyor configs --copy configs   # ./configs/*.toml, as the docs name them
    """
    found = shipped_configs()
    if not found:
        raise click.ClickException(f"no shipped configs in {shipped_configs_dir()} "
                                   "(a broken install: reinstall conveyor)")
    if name is not None:
        if copy_to is not None:
            raise click.UsageError("give NAME (print one) or --copy DIR (copy all), not both")
        key = Path(name).name.removesuffix(".toml")
        if key not in found:
            raise click.BadParameter(f"no shipped config {name!r}; there are: "
                                     f"{', '.join(found)}", param_hint="NAME")
        click.echo(found[key].read_text(), nl=False)
        return
    if copy_to is not None:
        target = copy_to
        try:
            copy_to.mkdir(parents=True, exist_ok=True)
            for path in found.values():
                target = copy_to / path.name
                try:  # "x": never over a file, nor through a link whose target is missing
                    file = target.open("xb")
                except FileExistsError:
                    click.echo(f"kept {target} (exists)")
                    continue
                try:
                    with file:
                        file.write(path.read_bytes())
                except OSError:
                    target.unlink()  # a cut file would be "kept" by the next copy
                    raise
                click.echo(f"wrote {target}")
        except OSError as exc:  # a user's path: one line, not a traceback
            raise click.BadParameter(f"cannot write to {target}: {exc.strerror or exc}",
                                     param_hint="--copy") from None
        return
    width = max(len(n) for n in found)
    room = 79 - width - 2
    for stem, path in found.items():
        text = _summary(path)
        click.echo(f"{stem:<{width}}  {text if len(text) <= room else text[:room - 1] + '…'}")
    click.echo(f"\n(in {shipped_configs_dir()}; `conveyor configs NAME` prints one)")
