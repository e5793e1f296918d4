"""The ``conveyor`` command: thin — parse, load config, call the library."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from conveyor.cli_common import fail, load_config_or_exit, usage
from conveyor.deploy.cli import deploy
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, ConveyorError, InvalidArgumentError
from conveyor.version import version

log = logging.getLogger("conveyor.cli")


_config = load_config_or_exit
_fail = fail
_usage = usage


def _refuse_embedded(config: Config, command: str, why: str) -> None:
    """A usage error for commands that need state outside this process (exit 2)."""
    if config.queues.adapter == "memory":
        raise click.UsageError(
            f"{command}: the memory adapter lives inside the worker's process, so {why}; "
            "use --config with a redis or kafka config (e.g. configs/redis.toml)"
        )


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML config file (see configs/). Defaults: the embedded memory adapter.",
)
broker_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML config of a redis or kafka app (configs/redis.toml, configs/kafka.toml). "
         "Needed: the embedded memory adapter, the default, lives inside the worker's "
         "process and is refused here.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version(), "--version", "-V", prog_name="conveyor",
                      message="%(prog)s %(version)s")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=None,
    help="Default: info for `worker`, warning for everything else.",
)
@click.pass_context
def main(ctx: click.Context, log_level: str | None) -> None:
    """Conveyor: a worker platform for messages in Kafka, Redis, or in-process."""
    _setup_logging(log_level or ("info" if ctx.invoked_subcommand == "worker" else "warning"))


@main.command()
@click.argument("app_path")
@config_option
@click.option("--slots", type=click.IntRange(min=1), help="Override [slots] count.")
@click.option(
    "--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=0),
    help="Override [worker] drain_timeout_s.",
)
@click.option(
    "--processes", metavar="MIN:MAX", default=None,
    help="Run MIN..MAX daemon processes, scaled on consumer lag (see [supervisor]).",
)
@click.option(
    "--http-port", type=click.IntRange(1, 65_535), default=None,
    help="Serve /metrics, /healthz and /readyz on this port (overrides [http] port).",
)
def worker(
    app_path: str, config_path: Path | None, slots: int | None, drain_timeout_s: float | None,
    processes: str | None, http_port: int | None,
) -> None:
    """Run a worker daemon for APP_PATH (MODULE:ATTR or FILE.py:ATTR) until SIGINT/SIGTERM.

    On a signal it drains: stops pulling, finishes in-flight messages within the drain
    timeout, acknowledges them, releases its queues and exits 0.

    Exit status: 0 after a drain; 2 for a bad argument or config, or an APP_PATH that
    cannot be imported (a missing module, or an app file that fails at import: a syntax
    error or an exception, reported with its file and line); 1 when the daemon fails.
    """
    from conveyor.loader import load_app
    from conveyor.workers.daemon import DrainReport, WorkerDaemon
    from conveyor.workers.http_endpoint import daemon_endpoint
    from conveyor.workers.serve import serve

    overrides: dict[str, dict[str, Any]] = {}
    if slots is not None:
        overrides["slots"] = {"count": slots}
    if drain_timeout_s is not None:
        overrides["worker"] = {"drain_timeout_s": drain_timeout_s}
    if http_port is not None:
        overrides["http"] = {"port": http_port}
    config = _config(config_path, overrides)
    try:
        app = load_app(app_path)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="APP_PATH") from None
    if processes is not None:
        from conveyor.workers.supervisor import parse_processes, run_supervisor

        try:  # only the argument's own errors are usage errors, not the run's
            parse_processes(processes)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--processes") from None
        try:
            run_supervisor(app_path, app.name, config, processes, config_path, overrides)
        except ConveyorError as exc:
            _fail(exc)
        return

    async def run() -> DrainReport:
        daemon = WorkerDaemon(app, config)
        ready = f"conveyor: worker {daemon.member.id} ready"
        endpoint = None
        if config.http.port is not None:
            endpoint = daemon_endpoint(daemon, config.http.host, config.http.port)
        return await serve(daemon, ready=lambda: click.echo(ready, err=True),
                           endpoint=endpoint)

    try:
        report = asyncio.run(run())
    except ConveyorError as exc:
        _fail(exc)
    click.echo(f"conveyor: drained {report}", err=True)


@main.command()
@click.argument("namespace")
@click.argument("key")
@click.argument("body")
@broker_config_option
@click.option("--header", "-H", multiple=True, help="NAME=VALUE, repeatable.")
@click.option("--content-type", default=None, help="Defaults to application/json.")
def publish(
    namespace: str,
    key: str,
    body: str,
    config_path: Path | None,
    header: tuple[str, ...],
    content_type: str | None,
) -> None:
    """Publish BODY to the stream NAMESPACE/KEY and print its sequence token."""
    from conveyor.platform.client import SyncClient
    from conveyor.platform.message import RESERVED_HEADERS

    headers: dict[str, str] = {}
    for item in header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--header")
        if name in RESERVED_HEADERS:
            raise click.BadParameter(
                f"{name!r} is reserved by the wire format (the command sets it: "
                f"{', '.join(sorted(RESERVED_HEADERS))}; content type: --content-type)",
                param_hint="--header",
            )
        headers[name] = value
    config = _config(config_path)
    _refuse_embedded(config, "publish", "a message published from here would vanish when "
                     "this command exits (publish from the worker's process instead, e.g. "
                     "in an @app.startup hook)")
    try:
        with SyncClient.from_config(config) as client:
            token = client.publish(namespace, key, body, headers, content_type)
    except InvalidArgumentError as exc:
        _usage(str(exc))
    except ConveyorError as exc:
        _fail(exc)
    click.echo(str(token))


app_option = click.option(
    "--app", "group", required=True, help="The app's name (its consumer group)."
)


def _status_view(report: Any, rates: dict[int, float]) -> Any:
    from rich.console import Group
    from rich.table import Table

    from conveyor.platform.groups import queue_ranges

    evicts = "" if report.eviction_policy is None else (
        f", maxmemory-policy {report.eviction_policy}")
    members = Table(title=f"app {report.group}: {len(report.members)} daemon(s), "
                          f"{_num(report.dead_letters)} dead letter(s) stored{evicts}")
    members.add_column("daemon", no_wrap=True)  # the id logs and metrics carry: never cut
    for heading in ("host", "pid", "queues", "slots in use", "slots available", "handled",
                    "dead-lettered", "skipped", "pools / cells (workers)"):
        members.add_column(heading)
    warnings: list[str] = []
    for m in report.members:
        st = m.stats
        hosted = ", ".join(
            f"{k.split('.', 1)[1].rsplit('.', 1)[0]}={v:.0f}" for k, v in sorted(st.items())
            if k.startswith(("pool.", "cell.")) and k.endswith(".workers")
        )
        members.add_row(
            m.id, m.host, str(m.pid) if m.pid else "-", queue_ranges(m.queues) or "-",
            _num(st.get("slots.in_use")),
            _num(st.get("slots.available")), _num(st.get("handled")),
            _num(st.get("dead_lettered")), _num(st.get("skipped")), hosted or "-",
        )
        if st.get("dead_letters.down_s") is not None:
            warnings.append(
                f"[red]{m.id}: the dead-letter store has failed for "
                f"{_age(st['dead_letters.down_s'])}; {st.get('dead_letters.waiting', 0):.0f} "
                "message(s) wait unacknowledged[/red]"
            )
        if st.get("dead_letters_evicted"):
            warnings.append(f"{m.id}: {st['dead_letters_evicted']:.0f} dead letter(s) evicted "
                            "by [dead_letters] max_entries")
    if warnings:
        members.caption = "\n".join(warnings)
    queues = Table("queue", "owner", "lag", "cache fill", "acks/s")
    for q in report.queues:
        rate = rates.get(q.queue)
        queues.add_row(str(q.queue), q.owner or "-", str(q.lag), _num(q.cache_fill),
                       "-" if rate is None else f"{rate:,.0f}")
    queues.add_row("total", "", str(report.total_lag), "", "")
    return Group(members, queues, _groups_table(report.groups, report.retention_follows_groups,
                                                report.at))


def _groups_table(groups: list[Any], retention_follows_groups: bool, now: float) -> Any:
    """Every app's group: lag, last read, members, and whom trimming waits for."""
    from rich.table import Table

    from conveyor.platform.groups import queue_ranges

    table = Table("group", "queues", "lag", "last read", "members", "holds retention",
                  title="consumer groups on these queues (every app)")
    for g in groups:
        held = "-"
        if g.holds_retention:
            held = f"queue(s) {queue_ranges(g.holds_retention)}"
            if g.oldest_needed_ms is not None:
                held += f" (oldest {_age(now - g.oldest_needed_ms / 1000)})"
        table.add_row(g.group, queue_ranges(g.queues), str(g.lag),
                      "-" if g.idle_s is None else f"{_age(g.idle_s)} ago", _num(g.members), held)
    holders = [g.group for g in groups if g.holds_retention]
    if not retention_follows_groups:
        table.caption = "retention goes by time or size here: no group holds it back"
    elif holders:
        table.caption = f"trimming waits for: {', '.join(holders)}"
    else:
        table.caption = "no group holds retention back"
    return table


def _age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.1f}s"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


@main.command()
@broker_config_option
@app_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", "watch_s", type=click.FloatRange(min=0.2), default=None,
              metavar="SECONDS", help="Refresh every SECONDS until Ctrl-C.")
@click.option("--count", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --watch: stop after N refreshes.")
def status(
    config_path: Path | None, group: str, as_json: bool, watch_s: float | None,
    count: int | None,
) -> None:
    """Daemons (slots, handled), per queue: owner, lag, cache fill, throughput; and every
    app's consumer group on the queues.

    Cache fill and throughput come from each owner's last heartbeat (every
    lease_ttl_s / 3): throughput is the acks per second the owner measured, or with
    --watch the rate between the heartbeats of two readings. Refreshing faster than
    heartbeats arrive shows the same figures again. The groups show their lag, when
    they last read (Redis), their members (Kafka), and which one trimming waits for.
    An --app with no group on any queue, or no running daemon, gets a one-line warning
    (exit 0). On kafka-group, daemons and owners come from the group coordinator and the
    daemons' own reports. The embedded (memory) adapter is refused (exit 2): its state
    lives in the worker's process.
    """
    import time
    from dataclasses import asdict

    from rich.console import Console
    from rich.live import Live

    from conveyor.platform.status import collect_status

    if count is not None and watch_s is None:
        raise click.UsageError("--count needs --watch")
    if as_json and watch_s is not None:
        raise click.UsageError("--json prints one reading; it cannot be combined with --watch")
    config = _config(config_path)
    _refuse_embedded(config, "status", "its daemons, queues and lag exist only there and "
                     "this command would show zeros")

    def read() -> Any:
        try:
            return asyncio.run(collect_status(config, group))
        except ConveyorError as exc:
            _fail(exc)

    report = read()
    if not report.has_group and not report.members:  # tansu: no group until a commit
        others = ", ".join(g.group for g in report.groups) or "none"
        click.echo(f"conveyor: warning: --app {group!r} has no consumer group on any queue "
                   f"(a typo, or an app that never ran; groups here: {others})", err=True)
    elif not report.members:
        click.echo(f"conveyor: warning: no daemon of --app {group!r} is running "
                   f"({_where_daemons_register(config)})", err=True)
    if report.eviction_policy not in (None, "noeviction"):
        accepted = ("accepted by [redis] allow_eviction = true" if config.redis.allow_eviction
                    else "workers refuse it unless [redis] allow_eviction = true")
        click.echo(f"conveyor: warning: Redis maxmemory-policy is {report.eviction_policy}: a "
                   f"full server deletes messages and leases ({accepted}; docs/redis.md, "
                   "\"Eviction policy\")", err=True)
    if as_json:
        click.echo(json.dumps(asdict(report)))
        return
    console = Console()
    if watch_s is None:
        console.print(_status_view(report, report.rates()))
        return
    with Live(_status_view(report, report.rates()), console=console,
              auto_refresh=False) as live:
        try:
            refreshes = 0
            while count is None or refreshes < count:
                time.sleep(watch_s)
                previous, report = report, read()
                live.update(_status_view(report, report.rates(previous)), refresh=True)
                refreshes += 1
        except KeyboardInterrupt:
            pass


def _where_daemons_register(config: Config) -> str:
    if config.balancer.kind == "kafka-group":
        return "none in its Kafka group, none reporting to the members topic"
    if config.balancer.kind == "static":
        return "static daemons register nowhere, so status cannot see them"
    return f"none registered in [balancer] membership = {config.balancer.membership!r}"


def _parse_rewind_target(text: str) -> Any:
    from datetime import UTC, datetime

    from conveyor.platform.ids import SequenceToken

    if ":" in text and "T" not in text and "-" not in text.split(":", 1)[0]:
        try:
            return SequenceToken.parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--to") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a token (QUEUE:MAJOR[-MINOR]) nor an ISO time "
            "(2026-11-22T10:00:00Z)", param_hint="--to",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


@main.command()
@broker_config_option
@app_option
@click.option("--to", "target", required=True, help="A sequence token or an ISO-8601 time.")
@click.option("--queue", "queues", type=int, multiple=True,
              help="Queues to rewind to a time (default: all). A token names its own queue.")
@click.option("--allow-forward", is_flag=True,
              help="Also move a position forward, skipping the messages in between "
                   "(refused by default, for every queue, before any is moved).")
@click.option("--create-group", is_flag=True,
              help="Create the app's consumer group where it has none (refused by default: "
                   "a group nobody runs stops Redis trimming).")
def rewind(config_path: Path | None, group: str, target: str, queues: tuple[int, ...],
           allow_forward: bool, create_group: bool) -> None:
    """Move an app's position back to a token or a point in time; run with workers stopped.

    Messages from that point on are delivered again (at least once: handlers must
    tolerate seeing them twice). A target ahead of the app's position (a later token,
    or a time after the last message) would skip messages never handled: it is a usage
    error (exit 2) unless --allow-forward is given. So is an app with no consumer group
    on the queues (a typo, or an app that never ran), unless --create-group is given. A
    queue that a worker of the app still owns (the adapter sees it, or its lease is
    held) is refused (exit 1). The embedded (memory) adapter is refused (exit 2): its
    positions live in the worker's process.
    """
    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.coordination import lease_owners
    from conveyor.platform.errors import ForwardRewindError, UnknownGroupError
    from conveyor.platform.ids import SequenceToken

    config = _config(config_path)
    to = _parse_rewind_target(target)
    _refuse_embedded(config, "rewind", "its positions exist only there and vanish with it")
    if isinstance(to, SequenceToken):
        chosen = [to.queue]
    else:
        chosen = list(queues) or list(range(config.queues.total))
    bad = [q for q in chosen if not 0 <= q < config.queues.total]
    if bad:
        raise click.BadParameter(f"no such queue(s) {bad}", param_hint="--queue/--to")

    async def run() -> None:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            held = await lease_owners(config, group)
            try:
                await adapter.rewind_queues(chosen, group, to, allow_forward=allow_forward,
                                            create_group=create_group, lease_owners=held)
            except ForwardRewindError as exc:
                raise click.BadParameter(str(exc), param_hint="--to") from None
        finally:
            await adapter.close()

    try:
        asyncio.run(run())
    except UnknownGroupError as exc:
        _usage(f"--app: {exc}")
    except ConveyorError as exc:
        _fail(exc)
    click.echo(f"rewound {group} on queue(s) {chosen} to {target}")


@main.group("groups")
def groups_cmd() -> None:
    """Consumer groups on the queues: every app's, and removing one nobody runs."""


@groups_cmd.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def groups_list(config_path: Path | None, as_json: bool) -> None:
    """Every app's group: queues, lag, last read, members, which one holds retention.

    The embedded (memory) adapter is refused (exit 2): its groups live in the worker's
    process."""
    import time
    from dataclasses import asdict

    from rich.console import Console

    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.groups import summarise

    config = _config(config_path)
    _refuse_embedded(config, "groups list", "its consumer groups exist only there and this "
                     "command would list none")

    async def run() -> tuple[list[Any], bool]:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            infos = await adapter.groups(range(config.queues.total))
            return summarise(infos), adapter.retention_follows_groups
        finally:
            await adapter.close()

    try:
        found, follows = asyncio.run(run())
    except ConveyorError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps({"groups": [asdict(g) for g in found],
                               "retention_follows_groups": follows}))
        return
    Console().print(_groups_table(found, follows, time.time()))


@groups_cmd.command("delete")
@config_option
@app_option
@click.option("--force", is_flag=True,
              help="Delete even though the app looks alive (its daemons would recreate the "
                   "group at the start of each queue and handle every kept message again).")
@click.option("--with-dead-letters", is_flag=True,
              help="Also delete the app's dead letters (kept by default).")
def groups_delete(config_path: Path | None, group: str, force: bool,
                  with_dead_letters: bool) -> None:
    """Remove an app's consumer group from every queue, so it no longer holds retention.

    Refused while the app looks alive (daemons registered, leases held, Kafka group
    members, a queue read in the last 10 s) unless --force: exit 1. An app with no group
    on any queue is a usage error (exit 2). On Redis its leases, fencing counters and
    membership go too; its dead letters only with --with-dead-letters. The embedded
    (memory) adapter is refused (exit 2): its groups live in the worker's process.
    """
    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.coordination import coordination_from_config
    from conveyor.platform.errors import UnknownGroupError
    from conveyor.platform.groups import delete_app_group, queue_ranges

    config = _config(config_path)
    _refuse_embedded(config, "groups delete", "its consumer groups exist only there and "
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
        _usage(f"--app: {exc}")
    except ConfigError as exc:
        _usage(str(exc))
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    kept = ("its dead letters too" if with_dead_letters
            else "dead letters kept (--with-dead-letters deletes them)")
    click.echo(f"deleted app {group!r}'s consumer group from queue(s) "
               f"{queue_ranges(removed) or 'none'}; {kept}")


@main.command()
@click.option("--messages", "-n", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="Messages to publish and handle.")
@click.option("--streams", "-s", type=click.IntRange(min=1), default=200, show_default=True,
              help="Stream keys the messages are spread over (each handled in order).")
@click.option(
    "--poison", type=click.IntRange(min=0), default=0, show_default=True,
    help="Messages whose handler always fails (they are retried, then dead-lettered).",
)
@click.option(
    "--work-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
    help="Simulated I/O time per message in the handler.",
)
@config_option
def demo(
    messages: int, streams: int, poison: int, work_ms: float, config_path: Path | None
) -> None:
    """The main job on the embedded adapter: publish, handle, count, summarise.

    Everything runs in this process. --config tunes slots, worker and balancer settings
    but must keep the embedded adapter and membership (queues.adapter = "memory",
    balancer.membership = "memory", as in configs/local.toml): a redis or kafka config
    is refused with a usage error. Exit status: 0 when nothing was lost, duplicated or
    reordered; 1 otherwise; 2 for a bad argument or config.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from conveyor.examples.demo import not_embedded, run_demo

    if poison > messages:
        raise click.BadParameter("cannot exceed --messages", param_hint="--poison")
    config = _config(config_path)
    problem = not_embedded(config)
    if problem:
        raise click.UsageError(f"--config: {problem}")
    logging.getLogger("conveyor.runtime").setLevel(logging.ERROR)  # poison is expected here
    try:
        with Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), transient=True,
        ) as progress:
            task = progress.add_task("handling", total=messages)
            result = asyncio.run(
                run_demo(
                    messages, streams, poison=poison, work_s=work_ms / 1000, config=config,
                    on_progress=lambda done: progress.update(task, completed=done),
                )
            )
    except ConveyorError as exc:
        _fail(exc)
    if result.out_of_order:
        click.echo(f"per-stream order violated {result.out_of_order} times", err=True)
    click.echo(result.summary())
    if result.lost or result.duplicates or result.out_of_order:
        sys.exit(1)


@main.group()
def bench() -> None:
    """Benchmarks that print their figure next to a baseline measured in the same run."""


@bench.command("throughput")
@click.option("--adapter", type=click.Choice(["memory", "redis", "kafka"]), default="memory",
              show_default=True)
@click.option("--messages", "-n", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--streams", "-s", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Stream keys the messages are spread over.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="Variant: [slots] count = N instead of the shipped value.")
@click.option("--set", "settings", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Variant: change one field of the shipped config (repeatable).")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), default=None,
              help="Start from this file instead of the adapter's file in configs/.")
@click.option("--redis-url", default=None,
              help="redis: the server to measure against (default: a private redis-server).")
@click.option("--daemons", type=click.Choice(["1", "2"]), multiple=True,
              help="redis: daemon counts to measure (default: 1 and 2; 1 always runs).")
@click.option("--bootstrap", default=None,
              help="kafka: HOST:PORT of a broker (default: start a private tansu).")
@click.option("--io-messages", type=click.IntRange(min=0), default=20_000, show_default=True,
              help="kafka: messages of the I/O-bound run (0: skip it).")
@click.option("--batch", type=click.IntRange(min=1, max=100_000), default=None,
              help="memory, redis: a batch handler of N (batch_size=N) instead of one "
              "message a call, next to a raw loop awaiting the no-op once per N.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_throughput(
    adapter: str, messages: int, streams: int, repeats: int, slots: int | None,
    settings: tuple[str, ...], config_file: Path | None, redis_url: str | None,
    daemons: tuple[str, ...], bootstrap: str | None, io_messages: int, batch: int | None,
    as_json: bool,
) -> None:
    """No-op msgs/s as the adapter's shipped config runs it, next to raw loops, both at
    steady state; and publish msgs/s next to a raw producer, in the same run.

    The config is configs/local.toml, redis.toml or kafka.toml with only the server and
    a private key prefix / topic changed; --slots, --set and --config make a variant,
    named in the output. Consumers are timed from their first record (Conveyor: the
    first delivery) to the last acknowledgement; start-up is reported apart. Floors:
    memory, a for loop awaiting the handler; redis, XREADGROUP COUNT 500 + XACK; kafka,
    getmany + commit. Publish: Client.publish_batch (500 a call) and single publish
    calls, next to pipelined XADD x500 / aiokafka send_batch / adapter.enqueue.
    --batch N: the handler is a batch handler of N and the floor reads N at a time
    (redis: XREADGROUP COUNT N) and awaits the no-op once per batch; redis then measures
    one daemon only.
    """
    from aiokafka.errors import KafkaError
    from redis.exceptions import RedisError

    from conveyor.adapters.redis_conn import redact_url
    from conveyor.bench.shipped import Variant, bench_config

    if batch is not None and adapter == "kafka":
        raise click.BadParameter("is measured on memory and redis, not kafka",
                                 param_hint="--batch")
    try:  # a variant the config refuses is the caller's mistake, found before any run
        variant = Variant.of(settings, slots=slots, config_file=config_file, batch=batch or 0)
        bench_config(adapter, {}, variant)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="--set / --slots / --config") from None
    try:
        report = _run_throughput(adapter, messages, streams, repeats, variant, redis_url,
                                 daemons, bootstrap, io_messages)
    except (ConveyorError, RuntimeError, OSError, RedisError, KafkaError) as exc:
        where = {"redis": redact_url(redis_url) if redis_url else "a private redis-server",
                 "kafka": bootstrap or "a private tansu"}.get(adapter, "memory")
        raise click.ClickException(f"benchmark against {where} failed: {exc}") from None
    click.echo(json.dumps(report[0]) if as_json else report[1])


def _run_throughput(
    adapter: str, messages: int, streams: int, repeats: int, variant: Any,
    redis_url: str | None, daemons: tuple[str, ...], bootstrap: str | None, io_messages: int,
) -> tuple[dict[str, Any], str]:
    """(JSON object, table) of `conveyor bench throughput`."""
    if adapter == "memory":
        from conveyor.bench.throughput import memory_throughput

        result = memory_throughput(messages, streams, repeats, variant)
        return result.as_dict(), result.table()
    if adapter == "kafka":
        from conveyor.bench.kafka_throughput import kafka_throughput

        report = kafka_throughput(messages, streams, repeats, bootstrap, io_messages, variant)
        return report.as_dict(), report.table()
    from conveyor.bench.redis_throughput import as_json, redis_throughput

    counts = tuple(sorted({1, *(int(d) for d in daemons or ("1", "2"))}))
    results = redis_throughput(redis_url, messages, streams, repeats, counts, variant)
    return as_json(results), "\n\n".join(r.table() for r in results.values())


@bench.command("telemetry")
@click.option("--messages", "-n", type=click.IntRange(min=1), default=50_000, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Interleaved runs per variant (each in a fresh process).")
@click.option("--sample-ratio", type=click.FloatRange(0, 1), default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_telemetry(messages: int, repeats: int, sample_ratio: float, as_json: bool) -> None:
    """Throughput uninstrumented (hooks stripped), with telemetry off, on, and with
    only the /metrics meter of [http] port.

    Prints each variant's median and spread, off / uninstrumented (the cost of the
    hooks when tracing is off), on / off (the cost of tracing) and /metrics only / off.
    """
    from conveyor.bench.telemetry_cost import telemetry_cost

    try:
        result = telemetry_cost(messages, repeats, sample_ratio)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(result.as_dict()) if as_json else result.table())


@bench.command("scale-down")
@click.option("--cycles", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--cycle-s", type=click.FloatRange(min=0.01), default=1.2, show_default=True)
@click.option("--load-s", type=click.FloatRange(min=0.01), default=2.0, show_default=True)
@click.option("--inspection-period-ms", type=click.FloatRange(min=1), default=500.0,
              show_default=True, help="Scale-down inspection period (backoff follows it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_scale_down(
    cycles: int, cycle_s: float, load_s: float, inspection_period_ms: float, as_json: bool
) -> None:
    """Monotonic vs adaptive stateless-worker pool: workers per cooldown cycle."""
    from conveyor.bench.scale_down import ScaleDownSettings, scale_down, table
    from conveyor.workers.scaledown import ScaleDownPolicy

    period_s = inspection_period_ms / 1000
    policy = ScaleDownPolicy(inspection_period_s=period_s, backoff_s=period_s)
    result = scale_down(ScaleDownSettings(
        cycles=cycles, cycle_s=cycle_s, load_s=load_s, policy=policy
    ))
    click.echo(json.dumps(result) if as_json else table(result))



def _register_lab() -> None:
    from conveyor.cli_dlq import dlq
    from conveyor.lab.cli import sim, tune

    main.add_command(sim)
    main.add_command(tune)
    main.add_command(dlq)


_register_lab()
main.add_command(deploy)

if __name__ == "__main__":  # pragma: no cover
    main()
