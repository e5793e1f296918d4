"""Real-valued genetic algorithm that tunes the scale-down PID gains in simulation.

The GA is the reference's: a population of ``(Kp, Ki, Kd)`` drawn from U(0, 1)³; each
generation keeps the best half (lowest fitness), breeds children as the mean of two
random parents from that half, and with probability ``mutation`` adds U(-0.05, 0.05)
to each gain of a child; gains are kept non-negative with ``abs``.

Decisions where the reference is silent or differs:

* **One GA over all training patterns.** An individual's fitness is the *mean* of its
  fitness on the six training patterns (Poisson is held out). The reference ran one GA
  per pattern and averaged the six winners; the average of six optima need not be
  good anywhere, a mean fitness is optimised directly.
* **The plateau is reported, not one arbitrary point of it.** The controller acts on
  the sign of its signal only, so whole regions of gain space make identical
  decisions and score exactly the same fitness. Taking ``argmin`` would return
  whichever of them the random generator happened to draw first. Instead we keep
  every individual ever evaluated (children replace the whole population, no elitism,
  as in the reference) and report the *plateau*: the distinct gain sets whose fitness
  is within ``plateau_tol`` of the best (the reference used a tolerance of 1e-6 on its
  final population), with its size, centroid and extent. The gains returned are the
  plateau member nearest its centroid: a point that provably scores the best fitness
  and sits in the middle of the equally good region rather than at an edge.
* **The reference's method is run too.** :func:`tune_per_pattern` runs one GA per
  training pattern and :func:`average_gains` averages their winners, which is what
  the reference reported; ``conveyor tune`` prints both, and how each does on every
  pattern, Poisson included.
* **Fitness** of one dynamic run =
  mean waiting count + mean queue length + overshoot + settling time, with

  - *overshoot* = peak queue length - mean queue length (the reference's);
  - *settling time* (seconds): let ``t_d`` be the end of the last disturbance, the
    last step in which the pool had to create a worker (0 if it never did). The pool
    has settled at the first time after ``t_d`` from which its worker count stays
    within a band of what the load keeps busy — at most ``max(1, 10 % of the run's
    peak worker count)`` idle workers — until the end of the run. Settling time is
    that time minus ``t_d``; a pool that never sheds its surplus scores everything
    left of the run. (The reference used the timestamp of the last sample, a constant
    60 s, so its settling term did not depend on the gains at all.)

  The terms mix units (messages and seconds) with weight 1 each, as the reference does.

Every pool of a generation is simulated in one vectorised batch per pattern
(:func:`conveyor.lab.sim.simulate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.lab.patterns import TRAINING_PATTERNS, generate
from conveyor.lab.sim import SimConfig, SimTrace, simulate
from conveyor.platform.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Gains = tuple[float, float, float]

SETTLING_BAND_FRACTION = 0.1


def settling_time_s(trace: SimTrace) -> float:
    """Seconds from the last scale-up until the idle surplus stays within the band."""
    import numpy as np

    created = np.flatnonzero(trace.created)
    start = int(created[-1]) if len(created) else 0
    t_d = float(trace.time_s[start]) if len(created) else 0.0
    band = max(1.0, SETTLING_BAND_FRACTION * float(trace.workers.max()))
    outside = np.flatnonzero(trace.idle[start:] > band)
    if len(outside) == 0:
        return 0.0
    after = start + int(outside[-1]) + 1
    # never back in band by the last sample: charged up to the end of the run
    settled_at = (
        float(trace.time_s[after]) if after < len(trace.time_s) else float(trace.time_s[-1])
    )
    return settled_at - t_d


def overshoot(trace: SimTrace) -> float:
    return float(trace.queue_length.max()) - trace.avg_queue_length


def fitness(trace: SimTrace) -> float:
    """Lower is better; see the module docstring for the terms."""
    return (
        trace.avg_avg_waiting + trace.avg_queue_length + overshoot(trace) + settling_time_s(trace)
    )


@dataclass(frozen=True, slots=True)
class Generation:
    index: int
    best_fitness: float
    """Best fitness evaluated so far, this generation included."""
    mean_fitness: float


@dataclass(frozen=True, slots=True)
class Plateau:
    """The distinct gain sets that score within the tolerance of the best fitness."""

    count: int
    centroid: Gains
    low: Gains
    high: Gains
    representative: Gains
    """The member nearest the centroid (Euclidean, in gain space)."""


@dataclass(frozen=True, slots=True)
class TuneResult:
    best_gains: Gains
    """``plateau.representative``: scores ``best_fitness``."""
    best_fitness: float
    plateau: Plateau
    history: tuple[Generation, ...]
    evaluations: int


DEFAULT_PLATEAU_TOL = 1e-6


def find_plateau(
    gains: npt.NDArray[np.float64], scores: npt.NDArray[np.float64], tol: float
) -> Plateau:
    """The plateau of the best score among ``gains`` (rows) scored ``scores``."""
    import numpy as np

    best = float(scores.min())
    members = np.unique(gains[scores <= best + tol], axis=0)
    centroid = members.mean(axis=0)
    nearest = members[int(np.argmin(((members - centroid) ** 2).sum(axis=1)))]
    return Plateau(
        count=len(members),
        centroid=_as_gains(centroid),
        low=_as_gains(members.min(axis=0)),
        high=_as_gains(members.max(axis=0)),
        representative=_as_gains(nearest),
    )


class Evaluator:
    """Fitness of gain sets on a fixed set of arrival patterns (mean over patterns)."""

    def __init__(
        self, patterns: Sequence[str], config: SimConfig, seed: int, rate: float = 100.0
    ) -> None:
        self.config = config
        self.seed = seed
        self.patterns = tuple(patterns)
        self.arrivals = {
            p: generate(p, seed, rate=rate, duration_s=config.duration_s) for p in self.patterns
        }
        self.evaluations = 0

    def per_pattern(self, gains: Sequence[Gains]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for p in self.patterns:
            traces = simulate(self.arrivals[p], self.config, gains, self.seed)
            out[p] = [fitness(t) for t in traces]
        self.evaluations += len(gains) * len(self.patterns)
        return out

    def __call__(self, gains: Sequence[Gains]) -> list[float]:
        per = self.per_pattern(gains)
        return [
            sum(per[p][i] for p in self.patterns) / len(self.patterns) for i in range(len(gains))
        ]


def tune(
    *,
    population: int = 20,
    generations: int = 50,
    mutation: float = 0.1,
    seed: int = 0,
    config: SimConfig | None = None,
    patterns: Sequence[str] = TRAINING_PATTERNS,
    plateau_tol: float = DEFAULT_PLATEAU_TOL,
    stream: int = 0,
    on_generation: Callable[[Generation], None] | None = None,
) -> TuneResult:
    """Run the GA; ``generations`` breeding rounds after the initial population.

    ``seed`` fixes the arrivals and service times; ``stream`` picks an independent
    random stream for the GA itself (initial population, pairing, mutation), so GAs
    on the same load can start from different populations.
    """
    import numpy as np

    if population < 2:
        raise InvalidArgumentError(f"population must be >= 2, got {population}")
    if generations < 0:
        raise InvalidArgumentError(f"generations must be >= 0, got {generations}")
    if not 0.0 <= mutation <= 1.0:
        raise InvalidArgumentError(f"mutation must be within [0, 1], got {mutation}")
    if not plateau_tol >= 0.0:
        raise InvalidArgumentError(f"plateau_tol must be >= 0, got {plateau_tol}")
    config = config if config is not None else SimConfig()
    evaluate = Evaluator(patterns, config, seed)
    rng = np.random.default_rng([seed, 0x6A, stream])
    pop: npt.NDArray[np.float64] = np.abs(rng.random((population, 3)))
    history: list[Generation] = []
    seen_gains: list[npt.NDArray[np.float64]] = []
    seen_scores: list[npt.NDArray[np.float64]] = []
    best_fit = float("inf")
    for gen in range(generations + 1):
        scores = np.asarray(evaluate([_as_gains(row) for row in pop]), dtype=np.float64)
        seen_gains.append(pop)
        seen_scores.append(scores)
        best_fit = min(best_fit, float(scores.min()))
        record = Generation(gen, best_fit, float(scores.mean()))
        history.append(record)
        if on_generation is not None:
            on_generation(record)
        if gen == generations:
            break
        parents = pop[np.argsort(scores, kind="stable")[: population // 2]]
        p1 = parents[rng.integers(len(parents), size=population)]
        p2 = parents[rng.integers(len(parents), size=population)]
        children = np.abs((p1 + p2) / 2.0)
        mutate = rng.random(population) < mutation
        children[mutate] = np.abs(
            children[mutate] + rng.uniform(-0.05, 0.05, (int(mutate.sum()), 3))
        )
        pop = children
    plateau = find_plateau(np.concatenate(seen_gains), np.concatenate(seen_scores), plateau_tol)
    return TuneResult(
        plateau.representative, best_fit, plateau, tuple(history), evaluate.evaluations
    )


def tune_per_pattern(
    patterns: Sequence[str] = TRAINING_PATTERNS,
    on_generation: Callable[[str, Generation], None] | None = None,
    **ga: Any,
) -> dict[str, TuneResult]:
    """The reference's method: one GA per pattern, each on its own random stream (the
    reference's GAs shared one generator, so none started from the same population)."""
    out: dict[str, TuneResult] = {}
    for index, name in enumerate(patterns, start=1):

        def report(gen: Generation, name: str = name) -> None:
            if on_generation is not None:
                on_generation(name, gen)

        out[name] = tune(patterns=(name,), stream=index, on_generation=report, **ga)
    return out


def average_gains(results: Mapping[str, TuneResult]) -> Gains:
    """The mean of the winners' gains, as the reference reported its tuned values."""
    n = len(results)
    if n == 0:
        raise InvalidArgumentError("no results to average")
    kp, ki, kd = (sum(r.best_gains[i] for r in results.values()) / n for i in range(3))
    return (kp, ki, kd)


def _as_gains(row: npt.NDArray[np.float64]) -> Gains:
    return (float(row[0]), float(row[1]), float(row[2]))
