"""``conveyor bench``: the benchmarks of :mod:`conveyor.bench` — throughput (memory,
Redis, Kafka), the cost of telemetry, and the scale-down of a stateless-worker pool —
each printed next to a baseline measured in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import (
    DAY_S,
    MAX_INT64,
    Bounded,
    FilePath,
    interrupted_at_once,
    usage,
)
from conveyor.platform.errors import ConveyorError

MAX_MESSAGES = 1_000_000
"""The most ``--messages`` (and ``--streams``, ``--io-messages``): a run builds every
message before it starts, and the memory adapter holds them all queued: a million took
1.8 GB and 15 s a repeat on memory (docs/performance.md's runs are 300,000 at most);
10**12 ran out of memory."""

MAX_REPEATS = 100
"""The most ``--repeats``: each is a whole run (a fresh process per variant, for
``telemetry``); 10**19 never ended."""

MAX_CYCLES = 1_000
"""The most ``scale-down --cycles``: each cycle runs in real time (``--cycle-s``, 1.2 s
by default: a thousand take 20 minutes) and prints a row; the adaptive pool of 10 is
empty after about 10 at the default policy. 10**19 never ended."""


@click.group()
def bench() -> None:
    """Benchmarks, each next to a baseline measured in the same run.

    \b
    Examples:
      conveyor bench throughput
      conveyor bench throughput --adapter redis --messages 50000
    """


def _settings(ctx: click.Context, param: click.Parameter,
              value: tuple[str, ...]) -> tuple[str, ...]:
    """``--set``: text UTF-8 can encode (it is read as TOML), each field once."""
    seen: set[str] = set()
    for setting in value:
        try:
            setting.encode()
        except UnicodeEncodeError:
            raise click.BadParameter(f"{setting!r} is not UTF-8 text") from None
        field = setting.partition("=")[0].strip()
        if field in seen:
            raise click.BadParameter(f"{field} is set twice; set it once")
        seen.add(field)
    return value


@bench.command("throughput", short_help="No-op and publish msgs/s, next to raw client loops.")
@click.option("--adapter", type=click.Choice(["memory", "redis", "kafka"]), default="memory",
              show_default=True)
@click.option("--messages", "-n", type=click.IntRange(1, MAX_MESSAGES), default=100_000,
              show_default=True)
@click.option("--streams", "-s", type=click.IntRange(1, MAX_MESSAGES), default=1_000,
              show_default=True, help="Stream keys the messages are spread over.")
@click.option("--repeats", type=click.IntRange(1, MAX_REPEATS), default=3, show_default=True)
@click.option("--slots", type=click.IntRange(min=1, max=MAX_INT64), default=None,
              help="Variant: [slots] count = N instead of the shipped value.")
@click.option("--set", "settings", multiple=True, metavar="SECTION.FIELD=VALUE",
              callback=_settings,
              help="Variant: change one field of the shipped config (repeatable).")
@click.option("--config", "config_file", type=FilePath(exists=True, dir_okay=False,
              path_type=Path), default=None,
              help="Start from this file instead of the adapter's file in configs/.")
@click.option("--redis-url", default=None,
              help="redis: the server to measure against (default: a private redis-server).")
@click.option("--daemons", type=click.Choice(["1", "2"]), multiple=True,
              help="redis: daemon counts to measure (default: 1 and 2; 1 always runs).")
@click.option("--bootstrap", default=None,
              help="kafka: HOST:PORT of a broker (default: start a private tansu).")
@click.option("--io-messages", type=click.IntRange(0, MAX_MESSAGES), default=20_000,
              show_default=True, help="kafka: messages of the I/O-bound run (0: skip it).")
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
    first delivery) to the last acknowledgement; start-up is reported apart. Two floors
    each: a loop that only counts what it reads (redis: XREADGROUP COUNT 500 + XACK;
    kafka: getmany(max_records=500) + commit) and the same loop awaiting the no-op per
    record (memory: a for loop awaiting the handler). Publish: Client.publish_batch
    (500 a call) and single publish calls, next to pipelined XADD x500 / aiokafka
    send_batch / adapter.enqueue; kafka also next to aiokafka send per record (500
    sends, then their futures awaited; the shipped linger_ms).
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

    from conveyor.adapters.redis.urls import redact_url
    from conveyor.bench.shipped import Variant, bench_config

    _check_servers(adapter, redis_url, daemons, bootstrap)
    if config_file is not None and not config_file.is_file():  # a pipe, read empty again
        usage(f"--config: {config_file} is not a regular file, and a benchmark reads its "
              "config again in each run (and in each worker it starts): give a file")
    if slots is not None and any(s.partition("=")[0].strip() == "slots.count"
                                 for s in settings):
        usage("--slots N is --set slots.count=N: give one of them")
    if batch is not None and adapter == "kafka":
        raise click.BadParameter("is measured on memory and redis, not kafka",
                                 param_hint="--batch")
    try:  # a variant the config refuses is the caller's mistake, found before any run
        variant = Variant.of(settings, slots=slots, config_file=config_file, batch=batch or 0)
        bench_config(adapter, {}, variant)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="--set / --slots / --config") from None
    try:
        with interrupted_at_once():  # its timed loops never yield to the event loop
            report = _run_throughput(adapter, messages, streams, repeats, variant,
                                     redis_url, daemons, bootstrap, io_messages)
    except (ConveyorError, RuntimeError, OSError, RedisError, KafkaError) as exc:
        where = {"redis": redact_url(redis_url) if redis_url else "a private redis-server",
                 "kafka": bootstrap or "a private tansu"}.get(adapter, "memory")
        raise click.ClickException(f"benchmark against {where} failed: {exc}") from None
    click.echo(json.dumps(report[0]) if as_json else report[1])


def _check_servers(adapter: str, redis_url: str | None, daemons: tuple[str, ...],
                   bootstrap: str | None) -> None:
    """An option of another adapter is refused (``--bootstrap`` without ``--adapter
    kafka`` measured the memory adapter, under the broker's name), and a server address
    is checked before any start-up."""
    from conveyor.platform.config.checks import check_bootstrap
    from conveyor.platform.config.redis_url import check_url

    for option, given, needs in (("--redis-url", redis_url is not None, "redis"),
                                 ("--daemons", bool(daemons), "redis"),
                                 ("--bootstrap", bootstrap is not None, "kafka")):
        if given and adapter != needs:
            usage(f"{option} is for --adapter {needs}, and this run measures {adapter}")
    try:  # an address a client would refuse only after the start-up
        if redis_url is not None:
            check_url(redis_url, field="--redis-url")
        if bootstrap is not None:
            check_bootstrap(bootstrap, field="--bootstrap")
    except ConveyorError as exc:
        usage(str(exc))


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


@bench.command("telemetry",
               short_help="Throughput: telemetry off, on, /metrics only, hooks stripped.")
@click.option("--messages", "-n", type=click.IntRange(1, MAX_MESSAGES), default=50_000,
              show_default=True)
@click.option("--repeats", type=click.IntRange(1, MAX_REPEATS), default=5, show_default=True,
              help="Interleaved runs per variant (each in a fresh process).")
@click.option("--sample-ratio", type=Bounded(0, 1), default=1.0, show_default=True)
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


@bench.command("scale-down", short_help="Monotonic vs adaptive pool: workers per cooldown cycle.")
@click.option("--cycles", type=click.IntRange(1, MAX_CYCLES), default=10, show_default=True)
@click.option("--cycle-s", type=Bounded(0.01, 3600), default=1.2, show_default=True)
@click.option("--load-s", type=Bounded(0.01, 3600), default=2.0, show_default=True)
@click.option("--inspection-period-ms", type=Bounded(1, DAY_S * 1000), default=500.0,
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
    from conveyor.workers.pools.scaledown import ScaleDownPolicy

    period_s = inspection_period_ms / 1000
    policy = ScaleDownPolicy(inspection_period_s=period_s, backoff_s=period_s)
    result = scale_down(ScaleDownSettings(
        cycles=cycles, cycle_s=cycle_s, load_s=load_s, policy=policy
    ))
    click.echo(json.dumps(result) if as_json else table(result))
