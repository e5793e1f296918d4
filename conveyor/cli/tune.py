"""``conveyor tune``: tune the scale-down PID gains with a genetic algorithm, on the
control lab's simulated load (:mod:`conveyor.lab.tune`).

Output goes to stdout (a report, or one JSON document with ``--json``); the progress bar
goes to stderr so it never mixes with JSON.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from conveyor.cli.common import SEED, Bounded
from conveyor.lab.patterns import PATTERNS, TRAINING_PATTERNS


@click.command()
@click.option("--population", type=click.IntRange(2, 1000), default=20, show_default=True)
@click.option("--generations", type=click.IntRange(0, 10_000), default=50, show_default=True)
@click.option(
    "--mutation",
    type=Bounded(0.0, 1.0),
    default=0.1,
    show_default=True,
    help="Probability that a child is mutated.",
)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def tune(population: int, generations: int, mutation: float, seed: int, as_json: bool) -> None:
    """Tune the scale-down PID gains with a genetic algorithm.

    On simulated load: trains on six arrival patterns (constant, periodic, ramp,
    spike, burst, chaotic);
    Poisson is held out. Runs one GA on the mean fitness over the six, and the
    reference's method (one GA per pattern, winners averaged). Reports the plateau of
    equally good gains, and how the tuned, the averaged and the shipped default gains
    do on every pattern.

    \b
    Examples:
      conveyor tune
      conveyor tune --population 8 --generations 3 --json
    """
    from conveyor.lab.sim import SimConfig
    from conveyor.lab.tune import Evaluator, average_gains, tune_per_pattern
    from conveyor.lab.tune import tune as run_tune
    from conveyor.workers.pools.scaledown import ScaleDownPolicy

    config = SimConfig()
    ga: dict[str, Any] = {
        "population": population,
        "generations": generations,
        "mutation": mutation,
        "seed": seed,
        "config": config,
    }
    started = time.perf_counter()
    with _TuneProgress(generations + 1, 1 + len(TRAINING_PATTERNS), transient=as_json) as bar:
        joint = run_tune(on_generation=bar.joint, **ga)
        per_pattern = tune_per_pattern(on_generation=bar.per_pattern, **ga)
    elapsed = time.perf_counter() - started
    defaults = ScaleDownPolicy()
    gains = {
        "tuned": joint.best_gains,
        "averaged": average_gains(per_pattern),
        "default": (defaults.kp, defaults.ki, defaults.kd),
    }
    table = _gain_table(Evaluator(PATTERNS, config, seed), gains)
    doc = _tune_doc(joint, per_pattern, gains, table, ga, elapsed)
    if as_json:
        click.echo(json.dumps(doc))
    else:
        _echo_tune_report(doc)


def _tune_doc(joint: Any, per_pattern: dict[str, Any], gains: dict[str, Any],
              table: Any, ga: dict[str, Any], elapsed: float) -> dict[str, Any]:
    """What ``conveyor tune --json`` prints (and the text report reads)."""
    return {
        "best": _gains_doc(joint.best_gains),
        "fitness": joint.best_fitness,
        "plateau": _plateau_doc(joint.plateau),
        "per_pattern": {
            name: {"best": _gains_doc(r.best_gains), "fitness": r.best_fitness}
            | {"plateau": _plateau_doc(r.plateau)}
            for name, r in per_pattern.items()
        },
        "averaged": _gains_doc(gains["averaged"]),
        "defaults": _gains_doc(gains["default"]),
        "population": ga["population"],
        "generations": ga["generations"],
        "mutation": ga["mutation"],
        "seed": ga["seed"],
        "evaluations": joint.evaluations + sum(r.evaluations for r in per_pattern.values()),
        "elapsed_s": elapsed,
        "training_patterns": list(TRAINING_PATTERNS),
        "history": [
            {"generation": g.index, "best": g.best_fitness, "mean": g.mean_fitness}
            for g in joint.history
        ],
        "patterns": table,
    }


class _TuneProgress:
    """One progress bar over all GAs of a tuning run, on stderr.

    The bar covers every generation of every GA; the text says which GA runs (``GA 2/7``)
    and its own generation as ``--generations`` counts them (``gen 0/3`` is the initial
    population, ``gen 3/3`` the last).
    """

    def __init__(self, generations: int, runs: int, transient: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("tuning GA {task.fields[run_no]}/{task.fields[runs]} ({task.fields[run]})"),
            BarColumn(),
            TextColumn("gen {task.fields[gen]}/{task.fields[generations]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=transient,
        )
        self._generations = generations
        self._task = self._progress.add_task(
            "tune", total=generations * runs, run="", run_no=0, runs=runs, gen=0,
            generations=generations - 1,
        )
        self._done_runs = 0
        self._current = ""

    def __enter__(self) -> _TuneProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)

    def _advance(self, run: str, index: int) -> None:
        if run != self._current:
            if self._current:
                self._done_runs += 1
            self._current = run
        done = self._done_runs * self._generations + index + 1
        self._progress.update(self._task, completed=done, run=run, run_no=self._done_runs + 1,
                              gen=index)

    def joint(self, gen: Any) -> None:
        self._advance("all six patterns", gen.index)

    def per_pattern(self, name: str, gen: Any) -> None:
        self._advance(name, gen.index)


def _gains_doc(gains: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip(("kp", "ki", "kd"), gains, strict=True))


def _plateau_doc(plateau: Any) -> dict[str, Any]:
    return {
        "count": plateau.count,
        "centroid": _gains_doc(plateau.centroid),
        "low": _gains_doc(plateau.low),
        "high": _gains_doc(plateau.high),
    }


def _fmt_gains(g: dict[str, float]) -> str:
    return f"Kp={g['kp']:.3f} Ki={g['ki']:.3f} Kd={g['kd']:.3f}"


def _fmt_extent(p: dict[str, Any]) -> str:
    lo, hi = p["low"], p["high"]
    return ", ".join(f"{k} {lo[k]:.3f}-{hi[k]:.3f}" for k in ("kp", "ki", "kd"))


def _echo_tune_report(doc: dict[str, Any]) -> None:
    plateau = doc["plateau"]
    click.echo(f"one GA on the mean over {', '.join(doc['training_patterns'])}:")
    click.echo(f"  best fitness {doc['fitness']:.4f}, reached by {plateau['count']} distinct")
    click.echo(f"  gain sets (plateau: {_fmt_extent(plateau)})")
    click.echo(f"  tuned = plateau member nearest its centroid: {_fmt_gains(doc['best'])}")
    click.echo("one GA per pattern (the reference's method): winner, fitness, plateau size")
    for name, r in doc["per_pattern"].items():
        click.echo(
            f"  {name:9} {_fmt_gains(r['best'])}  {r['fitness']:8.3f}  {r['plateau']['count']:4}"
        )
    click.echo(f"  averaged: {_fmt_gains(doc['averaged'])}")
    click.echo(
        f"shipped defaults: {_fmt_gains(doc['defaults'])}; "
        f"{doc['evaluations']} simulated runs in {doc['elapsed_s']:.1f} s"
    )
    labels = ("tuned", "averaged", "default")
    # Two blocks of at most 63 columns, so the report reads in an 80-column terminal.
    for title, columns in (
        (f"{'fitness':>26} {'avg queue':>26}",
         [("fitness", x, ".3f") for x in labels]
         + [("avg_queue_length", x, ".3f") for x in labels]),
        (f"{'avg workers':>35}", [("avg_workers", x, ".2f") for x in (*labels, "static")]),
    ):
        click.echo(f"{'pattern':9}{title}\n{'':9}" + "".join(f" {x[:8]:>8}" for _, x, _ in columns))
        for name, row in doc["patterns"].items():
            held = "*" if name not in doc["training_patterns"] else " "
            click.echo(f"{name + held:9}" + "".join(
                f" {row[x][key]:8{fmt}}" for key, x, fmt in columns))
    click.echo("* held out of training")


def _gain_table(
    evaluator: Any, gains: dict[str, tuple[float, float, float]]
) -> dict[str, dict[str, dict[str, float]]]:
    """Fitness, avg workers and avg queue of each named gain set, and of the static
    pool, on every pattern of ``evaluator``."""
    from conveyor.lab.sim import simulate
    from conveyor.lab.tune import fitness

    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in evaluator.patterns:
        arrivals = evaluator.arrivals[name]
        traces = simulate(arrivals, evaluator.config, list(gains.values()), evaluator.seed)
        (t_static,) = simulate(arrivals, evaluator.config, None, evaluator.seed)
        out[name] = {
            label: {
                "fitness": fitness(trace),
                "avg_workers": trace.avg_workers,
                "avg_queue_length": trace.avg_queue_length,
            }
            for label, trace in (*zip(gains, traces, strict=True), ("static", t_static))
        }
    return out
