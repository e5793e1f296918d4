"""The ``conveyor`` command: thin — parse, load config, call the library.

Commands are listed by task (:data:`conveyor.cli_common.SECTIONS`); each joins the main
command with one ``main.add_command(command, section=...)`` line at the end of this file.
Errors, from click, the config or the library, all print as ``conveyor: error: ...``
(:class:`conveyor.cli_common.TaskGroup`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from conveyor.cli_asyncapi import asyncapi
from conveyor.cli_common import TaskGroup, fail, load_config_or_exit, usage
from conveyor.cli_configs import configs
from conveyor.cli_dlq import dlq
from conveyor.cli_status import groups, refuse_embedded, status
from conveyor.console.command import console
from conveyor.deploy.cli import deploy
from conveyor.dev import dev
from conveyor.lab.cli import sim, tune
from conveyor.platform.errors import ConveyorError, InvalidArgumentError
from conveyor.version import version

log = logging.getLogger("conveyor.cli")


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


@click.group(cls=TaskGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    """Conveyor: a worker platform for messages in Kafka, Redis, or in-process.

    Every error is one line, `conveyor: error: ...`; the exit status is 2 for a bad
    argument or config, 1 when the run failed. `conveyor COMMAND --help` shows a
    command's options and examples.

    \b
    Examples:
      conveyor demo
      conveyor worker shop:app --config configs/redis.toml
      conveyor status --config configs/redis.toml
    """
    _setup_logging(log_level or ("info" if ctx.invoked_subcommand == "worker" else "warning"))


@click.command()
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
@click.option("--reload", is_flag=True,
              help="Development: drain and restart the worker when a .py file under the "
                   "app's directory (or the config) changes. Needs watchfiles.")
def worker(
    app_path: str, config_path: Path | None, slots: int | None, drain_timeout_s: float | None,
    processes: str | None, http_port: int | None, reload: bool,
) -> None:
    """Run an app's worker daemon until SIGINT/SIGTERM, then drain.

    APP_PATH is MODULE:ATTR or FILE.py:ATTR. It prints `conveyor: worker ID ready` once
    started. On a signal it drains: stops pulling, finishes in-flight messages within
    the drain timeout, acknowledges them, releases its queues, prints `conveyor:
    drained ...` (what it pulled, acknowledged, handled...) and exits 0. With
    --processes the same two lines cover all its processes.

    Exit status: 0 after a drain; 2 for a bad argument or config, or an APP_PATH that
    cannot be imported (a missing module, or an app file that fails at import: a syntax
    error or an exception, reported with its file and line); 1 when the daemon fails.

    \b
    Examples:
      conveyor worker shop:app
      conveyor worker shop:app --config configs/redis.toml --slots 16
      conveyor worker shop:app --config configs/redis.toml --processes 1:4
      conveyor worker shop:app --config configs/redis.toml --http-port 9464
      conveyor worker shop:app --reload
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
    config = load_config_or_exit(config_path, overrides)
    try:
        app = load_app(app_path)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="APP_PATH") from None
    if reload:
        from conveyor.reload import worker_with_reload

        sys.exit(worker_with_reload(click.get_current_context(), config))
    if processes is not None:
        from conveyor.workers.supervisor import parse_processes, run_supervisor

        try:  # only the argument's own errors are usage errors, not the run's
            parse_processes(processes)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--processes") from None
        try:
            report = run_supervisor(app_path, app.name, config, processes, config_path,
                                    overrides, ready=_say_ready)
        except ConveyorError as exc:
            fail(exc)
        click.echo(f"conveyor: drained {report}", err=True)
        return

    async def run() -> DrainReport:
        daemon = WorkerDaemon(app, config)
        endpoint = None
        if config.http.port is not None:
            endpoint = daemon_endpoint(daemon, config.http.host, config.http.port)
        said = f"conveyor: worker {daemon.member.id}"
        return await serve(daemon, endpoint=endpoint, ready=lambda: daemon.when_ready(
            lambda: _say_ready(daemon.member.id),
            lambda what: click.echo(f"{said} started; waiting for the {what}", err=True)))

    try:
        report = asyncio.run(run())
    except ConveyorError as exc:
        fail(exc)
    click.echo(f"conveyor: drained {report}", err=True)


def _say_ready(what: str) -> None:
    click.echo(f"conveyor: worker {what} ready", err=True)


@click.command()
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
    """Publish one message to a stream and print its sequence token.

    BODY goes to the stream NAMESPACE/KEY as it is (JSON by default); the token printed
    is QUEUE:MAJOR-MINOR, which `conveyor rewind --to` takes.

    \b
    Examples:
      conveyor publish orders order-17 '{"id": 17}' --config configs/redis.toml
      conveyor publish orders order-17 '{"id": 17}' -H tenant=acme
    """
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
    config = load_config_or_exit(config_path)
    refuse_embedded(config, "publish", "a message published from here would vanish when "
                    "this command exits (publish from the worker's process instead, e.g. "
                    "in an @app.startup hook)")
    try:
        with SyncClient.from_config(config) as client:
            token = client.publish(namespace, key, body, headers, content_type)
    except InvalidArgumentError as exc:
        usage(str(exc))
    except ConveyorError as exc:
        fail(exc)
    click.echo(str(token))


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


@click.command()
@broker_config_option
@click.option("--app", "group", required=True, help="The app's name (its consumer group).")
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
    """Move an app's position back to a token or a time.

    Run it with the app's workers stopped. Messages from that point on are delivered
    again (at least once: handlers must tolerate seeing them twice). A target ahead of
    the app's position (a later token,
    or a time after the last message) would skip messages never handled: it is a usage
    error (exit 2) unless --allow-forward is given. So is an app with no consumer group
    on the queues (a typo, or an app that never ran), unless --create-group is given. A
    queue that a worker of the app still owns (the adapter sees it, or its lease is
    held) is refused (exit 1). The embedded (memory) adapter is refused (exit 2): its
    positions live in the worker's process.

    \b
    Examples:
      conveyor rewind --app shop --to 2026-11-22T10:00:00Z \\
          --config configs/redis.toml
      conveyor rewind --app shop --to 3:1700000000000-3 \\
          --config configs/redis.toml
    """
    from conveyor.platform.adapter import create_adapter
    from conveyor.platform.coordination import lease_owners
    from conveyor.platform.errors import ForwardRewindError, UnknownGroupError
    from conveyor.platform.ids import SequenceToken

    config = load_config_or_exit(config_path)
    to = _parse_rewind_target(target)
    refuse_embedded(config, "rewind", "its positions exist only there and vanish with it")
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
        usage(f"--app: {exc}")
    except ConveyorError as exc:
        fail(exc)
    click.echo(f"rewound {group} on queue(s) {chosen} to {target}")


@click.command()
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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from conveyor.examples.demo import not_embedded, run_demo

    if poison > messages:
        raise click.BadParameter("cannot exceed --messages", param_hint="--poison")
    config = load_config_or_exit(config_path)
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
        fail(exc)
    if result.out_of_order:
        click.echo(f"per-stream order violated {result.out_of_order} times", err=True)
    click.echo(result.summary())
    if result.lost or result.duplicates or result.out_of_order:
        sys.exit(1)


@click.group()
def bench() -> None:
    """Benchmarks, each next to a baseline measured in the same run.

    \b
    Examples:
      conveyor bench throughput
      conveyor bench throughput --adapter redis --messages 50000
    """


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
    """No-op and publish msgs/s of a shipped config, next to raw client loops.

    No-op msgs/s as the adapter's shipped config runs it, next to raw loops, both at
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

    \b
    Examples:
      conveyor bench throughput --messages 20000 --repeats 1
      conveyor bench throughput --adapter redis --set worker.max_batch=512
      conveyor bench throughput --adapter kafka --json
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
    """Throughput with telemetry off, on, /metrics only, and hooks stripped.

    Throughput uninstrumented (hooks stripped), with telemetry off, on, and with only
    the /metrics meter of [http] port. Prints each variant's median and spread, off /
    uninstrumented (the cost of the
    hooks when tracing is off), on / off (the cost of tracing) and /metrics only / off.

    \b
    Examples:
      conveyor bench telemetry
      conveyor bench telemetry --sample-ratio 0.1 --json
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
    """Monotonic vs adaptive stateless-worker pool: workers per cooldown cycle.

    \b
    Examples:
      conveyor bench scale-down
      conveyor bench scale-down --cycles 20 --json
    """
    from conveyor.bench.scale_down import ScaleDownSettings, scale_down, table
    from conveyor.workers.scaledown import ScaleDownPolicy

    period_s = inspection_period_ms / 1000
    policy = ScaleDownPolicy(inspection_period_s=period_s, backoff_s=period_s)
    result = scale_down(ScaleDownSettings(
        cycles=cycles, cycle_s=cycle_s, load_s=load_s, policy=policy
    ))
    click.echo(json.dumps(result) if as_json else table(result))



# Every command, by section (cli_common.SECTIONS): `--help` lists them in this order.
main.add_command(worker, section="run")
main.add_command(demo, section="run")
main.add_command(publish, section="run")
main.add_command(configs, section="run")
main.add_command(dev, section="run")
main.add_command(status, section="inspect")
main.add_command(dlq, section="inspect")
main.add_command(groups, section="inspect")
main.add_command(asyncapi, section="inspect")
main.add_command(console, section="inspect")
main.add_command(rewind, section="operate")
main.add_command(deploy, section="operate")
main.add_command(bench, section="lab")
main.add_command(sim, section="lab")
main.add_command(tune, section="lab")

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="conveyor")
