"""``conveyor status`` and ``conveyor groups``: what runs on the queues, as tables that fit
80 columns.

The default layout is compact: the columns an operator reads first, short headings,
numbers right-aligned, no vertical rules. ``--wide`` adds the rest (host, pid, pools and
cells) for a wide terminal; ``--json`` gives everything. The reading is in
:mod:`conveyor.platform.status` and :mod:`conveyor.platform.groups`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import fail, load_config_or_exit, print_table, titled, usage, warn
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, ConveyorError

config_option = click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML config of a redis or kafka app (e.g. configs/redis.toml).",
)
wide_option = click.option("--wide", is_flag=True,
                           help="Every column (host, pid, pools and cells): for a wide terminal.")


def refuse_embedded(config: Config, command: str, why: str) -> None:
    """A usage error for commands that need state outside this process (exit 2)."""
    if config.queues.adapter == "memory":
        usage(f"{command}: the memory adapter lives inside the worker's process, so {why}; "
              "use --config with a redis or kafka config (e.g. configs/redis.toml)")


def _table(*columns: Any) -> Any:
    from rich import box
    from rich.table import Table

    return Table(*columns, box=box.SIMPLE_HEAD, show_edge=False)


def _right(heading: str) -> Any:
    from rich.table import Column

    return Column(heading, justify="right")


def _whole(heading: str) -> Any:
    """A column whose values are never cut nor wrapped (ids that logs carry)."""
    from rich.table import Column

    return Column(heading, no_wrap=True)


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.1f}s"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _plural(count: int | None, word: str) -> str:
    return f"{_num(count)} {word}(s)"


def status_view(report: Any, rates: dict[int, float], wide: bool = False) -> Any:
    """The three tables of ``conveyor status --app``: daemons, queues, groups."""
    from rich.console import Group

    from conveyor.platform.groups import queue_ranges

    title = (f"app {report.group}: {_plural(len(report.members), 'daemon')}, "
             f"{_plural(report.dead_letters, 'dead letter')} stored, "
             f"lag {report.total_lag:,}")
    members = _table(_whole("daemon"), "queues", _right("slots"), _right("handled"),
                     _right("dead"), _right("skipped"))
    if wide:
        for heading in ("host", "pid", "pools / cells (workers)"):
            members.add_column(heading)
    notes: list[Any] = []
    for m in report.members:
        st = m.stats
        row = [m.id, queue_ranges(m.queues) or "-",
               f"{_num(st.get('slots.in_use'))}/{_num(st.get('slots.available'))}",
               _num(st.get("handled")), _num(st.get("dead_lettered")), _num(st.get("skipped"))]
        if wide:
            hosted = ", ".join(
                f"{k.split('.', 1)[1].rsplit('.', 1)[0]}={v:.0f}" for k, v in sorted(st.items())
                if k.startswith(("pool.", "cell.")) and k.endswith(".workers")
            )
            row += [m.host, str(m.pid) if m.pid else "-", hosted or "-"]
        members.add_row(*row)
        notes += _member_warnings(m.id, st)
    if report.members:
        notes.insert(0, "slots: in use/available; dead: dead-lettered")
    queues = _table(_right("queue"), _whole("owner"), _right("lag"), _right("cache"),
                    _right("acks/s"))
    for q in report.queues:
        rate = rates.get(q.queue)
        queues.add_row(str(q.queue), q.owner or "-", f"{q.lag:,}", _num(q.cache_fill),
                       "-" if rate is None else f"{rate:,.0f}")
    queues.add_row("total", "", f"{report.total_lag:,}", "", "")
    groups = groups_view(report.groups, report.retention_follows_groups, report.at)
    return Group(titled(title, members, notes), "", queues, "", groups)


def _member_warnings(member: str, st: dict[str, float]) -> list[Any]:
    from rich.text import Text

    out = []
    if st.get("dead_letters.down_s") is not None:
        out.append(Text(f"{member}: the dead-letter store has failed for "
                        f"{_age(st['dead_letters.down_s'])}; "
                        f"{st.get('dead_letters.waiting', 0):.0f} message(s) wait "
                        "unacknowledged", style="red"))
    if st.get("dead_letters_evicted"):
        out.append(Text(f"{member}: {st['dead_letters_evicted']:.0f} dead letter(s) evicted "
                        "by [dead_letters] max_entries"))
    return out


def groups_view(groups: list[Any], retention_follows_groups: bool, now: float) -> Any:
    """Every app's group: lag, last read, members, and whom trimming waits for.

    "last read" (Redis) and "members" (Kafka) are shown where the backend tells them."""
    from conveyor.platform.groups import queue_ranges

    read = any(g.idle_s is not None for g in groups)
    members = any(g.members is not None for g in groups)
    table = _table(_whole("group"), "queues", _right("lag"))
    if read:
        table.add_column("last read", justify="right")
    if members:
        table.add_column("members", justify="right")
    table.add_column("holds retention")
    for g in groups:
        held = "-"
        if g.holds_retention:
            held = queue_ranges(g.holds_retention)
            if g.oldest_needed_ms is not None:
                held += f" (oldest {_age(now - g.oldest_needed_ms / 1000)})"
        row = [g.group, queue_ranges(g.queues), f"{g.lag:,}"]
        if read:
            row.append("-" if g.idle_s is None else f"{_age(g.idle_s)} ago")
        if members:
            row.append(_num(g.members))
        table.add_row(*row, held)
    holders = [g.group for g in groups if g.holds_retention]
    if not retention_follows_groups:
        note = "retention goes by time or size here: no group holds it back"
    elif holders:
        note = f"trimming waits for: {', '.join(holders)}"
    else:
        note = "no group holds retention back"
    title = (f"{_plural(len(groups), 'consumer group')} on these queues (every app)"
             if groups else "no consumer group on these queues")
    return titled(title, table, [note] if groups else [])


def apps_view(report: Any) -> Any:
    """``conveyor status`` without ``--app``: every app found on the queues."""
    from conveyor.platform.groups import queue_ranges

    table = _table(_whole("app"), _right("daemons"), "queues", _right("lag"),
                   _right("last read"), _right("dead letters"))
    for a in report.apps:
        table.add_row(a.app, _num(a.daemons), queue_ranges(a.queues), f"{a.lag:,}",
                      "-" if a.idle_s is None else f"{_age(a.idle_s)} ago",
                      _num(a.dead_letters))
    if not report.apps:
        return titled("no app on these queues yet (no consumer group on any of them)", None)
    return titled(f"{_plural(len(report.apps), 'app')} on these queues", table,
                  ["`conveyor status --app NAME`: one app's daemons and queues"])


@click.command()
@config_option
@click.option("--app", "group", default=None,
              help="The app's name (its consumer group). Default: list the apps found.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", "watch_s", type=click.FloatRange(min=0.2), default=None,
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
    with no group on any queue, or no running daemon, gets a one-line warning (exit 0).
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


def _read(work: Any) -> Any:
    try:
        return asyncio.run(work)
    except ConveyorError as exc:
        fail(exc)


def _print_apps(config: Config, as_json: bool) -> None:
    from conveyor.platform.status import collect_apps

    report = _read(collect_apps(config))
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    print_table(apps_view(report))


def _print_app(config: Config, group: str, as_json: bool, watch_s: float | None,
               count: int | None, wide: bool) -> None:
    from rich.console import Console
    from rich.live import Live

    from conveyor.platform.status import collect_status

    report = _read(collect_status(config, group))
    if not report.has_group and not report.members:  # tansu: no group until a commit
        others = ", ".join(g.group for g in report.groups) or "none"
        warn(f"--app {group!r} has no consumer group on any queue (a typo, or an app that "
             f"never ran; groups here: {others})")
    elif not report.members:
        warn(f"no daemon of --app {group!r} is running ({_where_daemons_register(config)})")
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    if watch_s is None:
        print_table(status_view(report, report.rates(), wide))
        return
    with Live(status_view(report, report.rates(), wide), console=Console(),
              auto_refresh=False) as live:
        try:
            refreshes = 0
            while count is None or refreshes < count:
                time.sleep(watch_s)
                previous, report = report, _read(collect_status(config, group))
                live.update(status_view(report, report.rates(previous), wide), refresh=True)
                refreshes += 1
        except KeyboardInterrupt:
            pass


def _where_daemons_register(config: Config) -> str:
    if config.balancer.kind == "kafka-group":
        return "none in its Kafka group, none reporting to the members topic"
    if config.balancer.kind == "static":
        return "static daemons register nowhere, so status cannot see them"
    return f"none registered in [balancer] membership = {config.balancer.membership!r}"


@click.group("groups")
def groups() -> None:
    """Consumer groups on the queues: list, delete one nobody runs.

    \b
    Examples:
      conveyor groups list --config configs/redis.toml
      conveyor groups delete --app old-app --config configs/redis.toml
    """


@groups.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def groups_list(config_path: Path | None, as_json: bool) -> None:
    """Every app's group: queues, lag, last read, members, who holds retention.

    The embedded (memory) adapter is refused (exit 2): its groups live in the worker's
    process.

    \b
    Examples:
      conveyor groups list --config configs/redis.toml
      conveyor groups list --config configs/kafka.toml --json
    """
    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.groups import summarise

    config = load_config_or_exit(config_path)
    refuse_embedded(config, "groups list", "its consumer groups exist only there and this "
                    "command would list none")

    async def run() -> tuple[list[Any], bool]:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            infos = await adapter.groups(range(config.queues.total))
            return summarise(infos), adapter.retention_follows_groups
        finally:
            await adapter.close()

    found, follows = _read(run())
    if as_json:
        click.echo(json.dumps({"groups": [asdict(g) for g in found],
                               "retention_follows_groups": follows}))
        return
    print_table(groups_view(found, follows, time.time()))


@groups.command("delete")
@config_option
@click.option("--app", "group", required=True, help="The app's name (its consumer group).")
@click.option("--force", is_flag=True,
              help="Delete even though the app looks alive (its daemons would recreate the "
                   "group at the start of each queue and handle every kept message again).")
@click.option("--with-dead-letters", is_flag=True,
              help="Also delete the app's dead letters (kept by default).")
def groups_delete(config_path: Path | None, group: str, force: bool,
                  with_dead_letters: bool) -> None:
    """Remove an app's consumer group from every queue (it holds retention no more).

    Refused while the app looks alive (daemons registered, leases held, Kafka group
    members, a queue read in the last 10 s) unless --force: exit 1. An app with no group
    on any queue is a usage error (exit 2). On Redis its leases, fencing counters and
    membership go too; its dead letters only with --with-dead-letters. The embedded
    (memory) adapter is refused (exit 2): its groups live in the worker's process.

    \b
    Examples:
      conveyor groups delete --app old-app --config configs/redis.toml
      conveyor groups delete --app old-app --with-dead-letters \\
          --config configs/redis.toml
    """
    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.coordination import coordination_from_config
    from conveyor.platform.errors import UnknownGroupError
    from conveyor.platform.groups import delete_app_group, queue_ranges

    config = load_config_or_exit(config_path)
    refuse_embedded(config, "groups delete", "its consumer groups exist only there and "
                    "vanish with it")

    async def run() -> list[int]:
        adapter = create_adapter(config.queues.adapter, config)
        membership, leases = coordination_from_config(config, group)
        try:
            return await delete_app_group(
                adapter, membership, leases, group, range(config.queues.total),
                force=force, dead_letters=with_dead_letters,
            )
        finally:
            await adapter.close()
            await membership.close()
            await leases.close()

    try:
        removed = asyncio.run(run())
    except UnknownGroupError as exc:
        usage(f"--app: {exc}")
    except ConfigError as exc:
        usage(str(exc))
    except ConveyorError as exc:
        fail(exc)
    kept = ("its dead letters too" if with_dead_letters
            else "dead letters kept (--with-dead-letters deletes them)")
    click.echo(f"deleted the consumer group of app {group!r} from queue(s) "
               f"{queue_ranges(removed) or 'none'}; {kept}")
