"""``conveyor status``: what runs on the queues — every app, or one app's daemons, queues
and lag, once or refreshed (``--watch``).

The reading is in :mod:`conveyor.platform.operations.status`; the tables in
:mod:`conveyor.cli.render`.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import (
    DAY_S,
    Bounded,
    app_name,
    fail,
    inspect_config_option,
    load_config_or_exit,
    refuse_embedded,
    run_command,
    run_or_exit,
    usage,
    warn,
)
from conveyor.cli.render import apps_view, fit_rows, print_table, status_view
from conveyor.platform.config import Config
from conveyor.platform.errors import ConveyorError
from conveyor.platform.terminal import visible

wide_option = click.option("--wide", is_flag=True,
                           help="Every column (host, pid, pools and cells), rows never cut: "
                                "for a wide terminal.")


@click.command()
@inspect_config_option
@click.option("--app", "group", default=None, callback=app_name,
              help="The app's name (its consumer group). Default: list the apps found.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", "watch_s", type=Bounded(0.2, DAY_S), default=None,
              metavar="SECONDS", help="Refresh every SECONDS until Ctrl-C.")
@click.option("--count", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --watch: stop after N refreshes.")
@wide_option
def status(config_path: Path | None, group: str | None, as_json: bool, watch_s: float | None,
           count: int | None, wide: bool) -> None:
    """An app's daemons, queues and lag; without --app, every app.

    With --app: its daemons (queues owned, slots in use/available, handled,
    dead-lettered, skipped), per queue the owner, lag, cache fill and throughput, and
    every app's consumer group on the queues (lag, last read, which one trimming waits
    for). Throughput is the acks per second the owner measured at its last heartbeat
    (every lease_ttl_s / 3), or with --watch the rate between two readings. An --app
    with no group on any queue, or no running daemon, gets a one-line warning (exit 0),
    as do messages on Redis queues past [queues] total; a Kafka topic whose partitions
    are not [queues] total is refused (exit 2).
    Without --app: every app with a consumer group on the queues, with its running
    daemons, lag and dead letters. The embedded (memory) adapter is refused (exit 2):
    its state lives in the worker's process.

    \b
    Examples:
      conveyor status --config configs/redis.toml
      conveyor status --app shop --config configs/redis.toml
      conveyor status --app shop --config configs/redis.toml --watch 2
      conveyor status --app shop --config configs/redis.toml --json
    """
    if count is not None and watch_s is None:
        usage("--count needs --watch")
    if as_json and watch_s is not None:
        usage("--json prints one reading; it cannot be combined with --watch")
    config = load_config_or_exit(config_path)
    refuse_embedded(config, "status", "its daemons, queues and lag exist only there and "
                    "this command would show zeros")
    if group is None:
        if watch_s is not None:
            usage("--watch needs --app")
        _print_apps(config, as_json)
    else:
        _print_app(config, group, as_json, watch_s, count, wide)


def _print_apps(config: Config, as_json: bool) -> None:
    from conveyor.backends import for_commands
    from conveyor.platform.operations.status import broker_warnings, collect_apps

    report = run_or_exit(collect_apps(config, for_commands(config)))
    for warning in broker_warnings(config, report.eviction_policy, report.persistence,
                                   report.beyond_total, report.store_problems):
        warn(warning)
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    print_table(apps_view(report))


def _print_app(config: Config, group: str, as_json: bool, watch_s: float | None,
               count: int | None, wide: bool) -> None:
    from rich.console import Console, Group
    from rich.live import Live

    from conveyor.backends import for_commands
    from conveyor.platform.operations.status import broker_warnings, collect_status

    backend = for_commands(config)
    report = run_or_exit(collect_status(config, group, backend))
    if not report.has_group and not report.members:  # tansu: no group until a commit
        others = ", ".join(g.group for g in report.groups) or "none"
        warn(f"--app {group!r} has no consumer group on any queue (a typo, or an app that "
             f"never ran; groups here: {others})")
    elif not report.members:
        warn(f"no daemon of --app {group!r} is running ({_where_daemons_register(config)})")
    for warning in broker_warnings(config, report.eviction_policy, report.persistence,
                                   report.beyond_total, report.store_problems):
        warn(warning)
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    view = status_view(report, report.rates(), wide)
    if watch_s is None:
        print_table(view, whole_rows=wide)
        return
    console = Console()
    if wide:
        fit_rows(console, view)
    # On a terminal each reading replaces the last. In a pipe or a file, rich's Live
    # prints only the last one, once the watch ends (`| head -1` printed nothing and
    # never ended): each is printed as it is read, after a blank line.
    live = Live(view, console=console, auto_refresh=False) if console.is_terminal else None

    def show(renderable: Any) -> None:
        if live is not None:
            live.update(renderable, refresh=True)
        else:
            click.echo()
            print_table(renderable, whole_rows=wide)

    if live is None:
        print_table(view, whole_rows=wide)
    failed: ConveyorError | None = None
    with live or contextlib.nullcontext():
        try:
            refreshes = 0
            while count is None or refreshes < count:
                time.sleep(watch_s)
                refreshes += 1
                try:
                    reading = run_command(collect_status(
                        config, group, backend, look_beyond=False, look_stores=False))
                except ConveyorError as exc:  # a broker restarting: the watch goes on
                    failed = exc
                    line = _failed_line(exc, report.at)  # under the tables it is about
                    show(Group(view, line) if live is not None else line)
                    continue
                failed, previous, report = None, report, reading
                view = status_view(report, report.rates(previous), wide)
                if wide:
                    fit_rows(console, view)
                show(view)
        except KeyboardInterrupt:  # how a watch ends (exit 0), whatever the last reading
            failed = None
    if failed is not None:  # --count's last reading failed: not a reading to trust
        fail(failed)


def _failed_line(exc: ConveyorError, shown_at: float) -> Any:
    from rich.text import Text

    at = datetime.fromtimestamp(shown_at, UTC).strftime("%H:%M:%S")
    return Text(f"reading failed, retrying (the tables are from {at} UTC): "
                f"{visible(str(exc))}", style="red")


def _where_daemons_register(config: Config) -> str:
    if config.balancer.kind == "kafka-group":
        return "none in its Kafka group, none reporting to the members topic"
    if config.balancer.kind == "static":
        return "static daemons register nowhere, so status cannot see them"
    return f"none registered in [balancer] membership = {config.balancer.membership!r}"
