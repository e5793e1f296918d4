"""``conveyor sim``: the control lab's simulations (:mod:`conveyor.lab`) — a
stateless-worker pool's scale-down (``sim``), the CDM-KF (``sim filter``), placement
(``sim placement``) and the balancer at scale (``sim balancer``).

Output goes to stdout: a table, or one JSON document with ``--json``; ``--plot`` writes
a PNG.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import SEED, Bounded, FilePath
from conveyor.lab.patterns import PATTERNS
from conveyor.lab.signals import SIGNALS
from conveyor.platform.config import MAX_QUEUES

REPLAY_COOLDOWN_S = 10.0
MAX_STEADY_S = 600.0
"""The most ``sim balancer --steady``: ten times the default. A virtual second of the
default 1,000 daemons costs about 1.5 s of wall-clock time on a 2-core VM, so the day
allowed before was a run of some 36 hours."""


def _plot_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Refuse a --plot file that cannot be written before the simulation runs (exit 2)."""
    if value is None:
        return None
    folder = value.parent
    try:
        is_dir = folder.is_dir()
    except OSError as exc:  # a name past the file system's limit: ENAMETOOLONG
        raise click.BadParameter(f"cannot write {value}: {exc.strerror}") from None
    if not is_dir:
        raise click.BadParameter(f"cannot write {value}: no such directory {folder}")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"cannot write {value}: directory {folder} is not writable")
    return value


def _write_plot(plot: Path, draw: Callable[[], None]) -> None:
    """Draw; a file that still cannot be written (a full disk) is one line, exit 2."""
    try:
        draw()
    except OSError as exc:
        raise click.BadParameter(f"cannot write {plot}: {exc.strerror or exc}",
                                 param_hint="--plot") from None


plot_option = click.option(
    "--plot", type=FilePath(dir_okay=False, path_type=Path), callback=_plot_path,
    help="Write a PNG here.",
)


def _summary(trace: Any) -> dict[str, float]:
    return {"avg_workers": trace.avg_workers, "avg_queue_length": trace.avg_queue_length}


@click.group(invoke_without_command=True)
@click.option("--pattern", type=click.Choice(PATTERNS), help="Arrival pattern to simulate.")
@click.option(
    "--arrivals",
    type=FilePath(exists=True, dir_okay=False, path_type=Path),
    help="Replay a file of arrival times (one float, seconds, per line) instead.",
)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Random seed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@plot_option
@click.pass_context
def sim(
    ctx: click.Context,
    pattern: str | None,
    arrivals: Path | None,
    seed: int,
    as_json: bool,
    plot: Path | None,
) -> None:
    """Simulate a stateless-worker pool: static vs PID scale-down.

    Static (scale-up only) vs dynamic (PID scale-down): prints average workers and
    average queue length of both runs. Subcommands `filter`, `placement` and
    `balancer` run the CDM-KF, the placement and the balancer-at-scale simulations.

    \b
    Examples:
      conveyor sim --pattern spike
      conveyor sim --pattern burst --seed 3 --plot burst.png
      conveyor sim filter --signal drop
    """
    if ctx.invoked_subcommand is not None:
        if pattern or arrivals or plot or as_json:
            raise click.UsageError(
                f"options of `sim` go with a simulation, not with `sim {ctx.invoked_subcommand}`;"
                f" give them after the subcommand"
            )
        return
    if (pattern is None) == (arrivals is None):
        raise click.UsageError("give exactly one of --pattern or --arrivals (or a subcommand)")

    from conveyor.lab.patterns import ArrivalsFileError, generate, load_arrivals
    from conveyor.lab.sim import SimConfig, compare

    if arrivals is not None:
        try:
            times = load_arrivals(arrivals)
        except ArrivalsFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--arrivals") from None
        except UnicodeDecodeError as exc:
            raise click.BadParameter(
                f"{arrivals}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                f"{exc.start}); expected one number of seconds per line",
                param_hint="--arrivals") from None
        except OSError as exc:
            raise click.BadParameter(f"cannot read {arrivals}: {exc.strerror or exc}",
                                     param_hint="--arrivals") from None
        duration = max(60.0, math.ceil(float(times[-1])) + REPLAY_COOLDOWN_S)
        config = SimConfig(duration_s=duration)
        name = "replay"
    else:
        assert pattern is not None
        config = SimConfig()
        times = generate(pattern, seed, duration_s=config.duration_s)
        name = pattern
    cmp = compare(times, config, seed=seed)
    if plot is not None:
        from conveyor.lab.plots import plot_comparison

        _write_plot(plot, lambda: plot_comparison(
            cmp, f"{name} (seed {seed}): static vs dynamic", plot))
    if as_json:
        doc = {"pattern": name, "static": _summary(cmp.static), "dynamic": _summary(cmp.dynamic)}
        click.echo(json.dumps(doc))
        return
    click.echo(
        f"pattern {name}: {cmp.static.arrived} messages over {config.duration_s:g} s, seed {seed}"
    )
    click.echo(f"{'':8} {'avg workers':>12} {'avg queue length':>17}")
    for label, trace in (("static", cmp.static), ("dynamic", cmp.dynamic)):
        click.echo(f"{label:8} {trace.avg_workers:12.3f} {trace.avg_queue_length:17.3f}")
    if plot is not None:
        click.echo(f"plot written to {plot}")


def _series_stats(values: Any) -> dict[str, float]:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "std": float(arr.std()),
        "mean_abs_change": float(np.abs(np.diff(arr)).mean()) if len(arr) > 1 else 0.0,
    }


@sim.command("filter")
@click.option("--signal", "signal_name", type=click.Choice(SIGNALS), required=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@plot_option
def filter_command(signal_name: str, seed: int, as_json: bool, plot: Path | None) -> None:
    """Run a synthetic CPU signal through the CDM-KF: raw vs filtered.

    \b
    Examples:
      conveyor sim filter --signal drop
      conveyor sim filter --signal wave --plot wave.png
    """
    from conveyor.lab.signals import make_signal
    from conveyor.platform.balancing.kalman import cdm_filter

    raw = make_signal(signal_name, seed)
    filtered = cdm_filter(float(v) for v in raw)
    doc: dict[str, Any] = {
        "signal": signal_name,
        "samples": len(raw),
        "raw": _series_stats(raw),
        "filtered": _series_stats(filtered),
    }
    if signal_name == "drop":
        start, width = int(0.6 * len(raw)), max(1, int(0.03 * len(raw)))
        level = float(raw[start - 100 : start].mean())
        doc["stall"] = {
            "raw_fall": level - float(raw[start : start + width].min()),
            "filtered_fall": level - min(filtered[start : start + width]),
        }
    elif signal_name == "rise":
        start = int(0.4 * len(raw))
        new = float(raw[start:].mean())
        old = float(raw[:start].mean())
        reached = next(
            (i for i, v in enumerate(filtered[start:]) if v >= old + 0.9 * (new - old)), None
        )
        doc["rise"] = {"samples_to_90_percent": reached}
    if plot is not None:
        from conveyor.lab.plots import plot_filter
        from conveyor.platform.balancing.kalman import single_filter

        samples = [float(v) for v in raw]
        _write_plot(plot, lambda: plot_filter(
            samples, filtered, f"CDM-KF on '{signal_name}' (seed {seed})", plot,
            extra={"single KF, Q=0": single_filter(samples, 0.0)},
        ))
    if as_json:
        click.echo(json.dumps(doc))
        return
    click.echo(f"signal {signal_name}: {len(raw)} samples")
    click.echo(f"{'':9} {'mean':>8} {'min':>8} {'max':>8} {'std':>8} {'mean |Δ|':>9}")
    for label in ("raw", "filtered"):
        s = doc[label]
        click.echo(
            f"{label:9} {s['mean']:8.2f} {s['min']:8.2f} {s['max']:8.2f} {s['std']:8.2f} "
            f"{s['mean_abs_change']:9.3f}"
        )
    for key in ("stall", "rise"):
        if key in doc:
            click.echo(f"{key}: " + ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in doc[key].items()))


@sim.command("placement", short_help="Balls into bins, 2-1,000 daemons: random, K=2, sqrt n, JSQ.")
@click.option("--trials", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--balls-per-bin", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@plot_option
def placement_command(
    trials: int, balls_per_bin: int, seed: int, as_json: bool, plot: Path | None
) -> None:
    """Balls into bins for 2-1,000 daemons: random, K=2, K=sqrt n, JSQ.

    Random, K=2, K=ceil(sqrt n) and JSQ, with fresh and stale (refreshed every n
    placements) statistics.

    \b
    Examples:
      conveyor sim placement
      conveyor sim placement --trials 1 --json
    """
    from conveyor.lab.placement_sim import DEFAULT_SIZES, run

    stats = run(DEFAULT_SIZES, balls_per_bin=balls_per_bin, trials=trials, seed=seed)
    if plot is not None:
        from conveyor.lab.plots import plot_placement

        _write_plot(plot, lambda: plot_placement(stats, balls_per_bin, plot, trials))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "balls_per_bin": balls_per_bin,
                    "trials": trials,
                    "results": [
                        {
                            "n": s.n,
                            "strategy": s.strategy,
                            "stale": s.stale,
                            "max_load": s.max_load,
                            "spread": s.spread,
                        }
                        for s in stats
                    ],
                }
            )
        )
        return
    click.echo(f"{balls_per_bin}·n balls on n bins, mean of {trials} trials: max load / spread")
    header = f"{'n':>5} {'stats':6}" + "".join(
        f" {name:>13}" for name in ("random", "K=2", "K=sqrt(n)", "JSQ")
    )
    click.echo(header)
    rows: dict[tuple[int, bool], list[str]] = {}
    for s in stats:
        rows.setdefault((s.n, s.stale), []).append(f"{s.max_load:6.1f}/{s.spread:<6.1f}")
    for (n, stale), cells in rows.items():
        click.echo(f"{n:5} {'stale' if stale else 'fresh':6}" + "".join(f" {c:>13}" for c in cells))


@sim.command("balancer")
@click.option("--daemons", type=click.IntRange(1, MAX_QUEUES), default=1000, show_default=True)
@click.option("--queues", type=click.IntRange(1, MAX_QUEUES), default=4096,
              show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--steady", "steady_s", type=Bounded(1.0, MAX_STEADY_S), default=60.0,
              show_default=True,
              help="Seconds (virtual) of steady state to measure; long enough to include "
                   "the full re-check a settled daemon makes every 30-60 intervals. At "
                   "most 600.")
@click.option("--ramp", "ramp_s", type=Bounded(0.0, 60.0), default=2.0,
              show_default=True,
              help="Seconds (virtual) over which the daemons start (0: all at once); at "
                   "most the 60 s a start is given to settle.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@plot_option
def balancer_command(daemons: int, queues: int, seed: int, steady_s: float, ramp_s: float,
                     as_json: bool, plot: Path | None) -> None:
    """The dynamic balancer at scale, on a virtual clock.

    The store's steady load (ops, keys, bytes per second), how long a join, a graceful
    leave and a crash take to settle, and how many queues move.

    \b
    Examples:
      conveyor sim balancer
      conveyor sim balancer --daemons 100 --queues 512 --json
    """
    from conveyor.lab.balancer_sim import BalancerSimConfig, run

    if daemons > queues:
        raise click.BadParameter(
            f"{daemons} daemons for {queues} queues: some would own nothing and the "
            f"split could never be even; give at most as many daemons as queues",
            param_hint="--daemons")
    result = run(BalancerSimConfig(daemons=daemons, queues=queues, seed=seed,
                                   steady_s=steady_s, ramp_s=ramp_s))
    if plot is not None:
        from conveyor.lab.plots import plot_balancer

        _write_plot(plot, lambda: plot_balancer(result, plot))
    if as_json:
        click.echo(json.dumps(_balancer_doc(result)))
        return
    _echo_balancer(result)
    if plot is not None:
        click.echo(f"plot written to {plot}")


def _settle_doc(s: Any) -> dict[str, Any]:
    return {"event": s.event, "settle_s": None if s.settle_s is None else round(s.settle_s, 2),
            "moved": s.moved, "handed_off": s.handed_off, "double_owned": s.double_owned}


def _key(category: str) -> str:
    return category.replace(" ", "_").replace("/", "_")


def _balancer_doc(r: Any) -> dict[str, Any]:
    return {
        "daemons": r.config.daemons, "queues": r.config.queues, "seed": r.config.seed,
        "lease_ttl_s": r.config.lease_ttl_s,
        "rebalance_interval_s": r.config.rebalance_interval_s,
        "steady": {_key(load.category): {"ops_per_s": round(load.ops_per_s, 1),
                                         "keys_per_s": round(load.keys_per_s, 1),
                                         "bytes_per_s": round(load.bytes_per_s)}
                   for load in r.load},
        "steady_total": {"ops_per_s": round(sum(load.ops_per_s for load in r.load), 1),
                         "bytes_per_s": round(sum(load.bytes_per_s for load in r.load)),
                         "peak_ops_per_s": round(r.peak_ops_per_s, 1)},
        "startup": _settle_doc(r.startup),
        "events": [_settle_doc(s) for s in r.events],
        "wall_s": round(r.wall_s, 2),
    }


def _rate(value: float, unit: str) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.1f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


def _echo_balancer(r: Any) -> None:
    cfg = r.config
    click.echo(f"{cfg.daemons} daemons x {cfg.queues} queues, seed {cfg.seed}")
    click.echo(f"lease ttl {cfg.lease_ttl_s:g} s, re-balance every "
               f"{cfg.rebalance_interval_s:g} s, heartbeat {cfg.heartbeat_s:g} s")
    click.echo(f"steady state over {cfg.steady_s:g} s (store load):")
    click.echo(f"  {'':16} {'ops/s':>10} {'keys/s':>10} {'bytes/s':>12}")
    for load in r.load:
        click.echo(f"  {load.category:16} {load.ops_per_s:10.1f} {load.keys_per_s:10.1f} "
                   f"{_rate(load.bytes_per_s, 'B'):>12}")
    total_ops = sum(load.ops_per_s for load in r.load)
    total_bytes = sum(load.bytes_per_s for load in r.load)
    click.echo(f"  {'total':16} {total_ops:10.1f} {'':10} {_rate(total_bytes, 'B'):>12}")
    click.echo(f"  busiest 0.1 s: {r.peak_ops_per_s:.0f} ops/s")
    click.echo(f"  {'event':16} {'settled in':>10} {'moved':>10} {'handed off':>12} "
               f"{'doubled':>8}")
    for s in (r.startup, *r.events):
        took = "never" if s.settle_s is None else f"{s.settle_s:.2f} s"
        click.echo(f"  {s.event:16} {took:>10} {s.moved:10} {s.handed_off:12} "
                   f"{s.double_owned:8}")
    click.echo(f"simulated in {r.wall_s:.1f} s of wall-clock time")
