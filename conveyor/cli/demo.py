"""``conveyor demo``: publish, handle and count messages, all in this process, on the
embedded adapter (:mod:`conveyor.examples.demo`), with a progress bar."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click

from conveyor.cli.common import Bounded, config_option, fail, load_config_or_exit
from conveyor.platform.errors import ConveyorError

MAX_MESSAGES = 1_000_000
"""The most ``--messages``: the embedded adapter holds every message (about 250 bytes
each), so a million is some 300 MB and ten seconds; 10**12 ran for days, out of memory."""


@click.command()
@click.option("--messages", "-n", type=click.IntRange(1, MAX_MESSAGES), default=20_000,
              show_default=True,
              help="Messages to publish and handle (at most a million).")
@click.option("--streams", "-s", type=click.IntRange(1, MAX_MESSAGES), default=200,
              show_default=True,
              help="Stream keys the messages are spread over (each handled in order; at "
              "most a million, as messages: more would name no more keys).")
@click.option(
    "--poison", type=click.IntRange(min=0), default=0, show_default=True,
    help="Messages whose handler always fails (they are retried, then dead-lettered).",
)
@click.option(
    "--work-ms", type=Bounded(0, 60_000), default=0.0, show_default=True,
    help="Simulated I/O time per message in the handler (at most a minute).",
)
@config_option
def demo(
    messages: int, streams: int, poison: int, work_ms: float, config_path: Path | None
) -> None:
    """Publish, handle and count messages, all in this process.

    The main job on the embedded adapter, summarised. --config tunes slots, worker
    and balancer settings but must keep the embedded adapter and membership
    (queues.adapter = "memory", balancer.membership = "memory", as in
    configs/local.toml): a redis or kafka config is refused with a usage error. Exit
    status: 0 when nothing was lost, duplicated or
    reordered; 1 otherwise; 2 for a bad argument or config.

    \b
    Examples:
      conveyor demo
      conveyor demo --messages 100000 --poison 5 --work-ms 2
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from conveyor.examples.demo import not_embedded, run_demo

    if poison > messages:
        raise click.BadParameter("cannot exceed --messages", param_hint="--poison")
    config = load_config_or_exit(config_path)
    problem = not_embedded(config)
    if problem:
        raise click.UsageError(f"--config: {problem}")
    logging.getLogger("conveyor.runtime").setLevel(logging.ERROR)  # poison is expected here
    # The bar is for a terminal, on stderr: stdout is the summary line alone, so that
    # `conveyor demo > out` or `| tail -1` gets that line and no bar's blank line.
    bar_console = Console(stderr=True)
    try:
        with Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), transient=True, console=bar_console,
            disable=not bar_console.is_terminal,
        ) as progress:
            task = progress.add_task("handling", total=messages)
            result = asyncio.run(
                run_demo(
                    messages, streams, poison=poison, work_s=work_ms / 1000, config=config,
                    on_progress=lambda done: progress.update(task, completed=done),
                )
            )
    except ConveyorError as exc:
        fail(exc)
    if result.out_of_order:
        click.echo(f"per-stream order violated {result.out_of_order} times", err=True)
    click.echo(result.summary())
    if result.lost or result.duplicates or result.out_of_order:
        sys.exit(1)
