"""Balls into bins: how good is power-of-K placement, with fresh and stale statistics?

For each cluster size ``n`` we place ``balls_per_bin x n`` balls (units of work) one at
a time on ``n`` bins (daemons) and report the final *maximum load* and *spread*
(max - min), averaged over ``trials``. Strategies:

``random``   one random bin (K = 1)
``k2``       best of 2 random distinct bins
``ksqrt``    best of ``ceil(sqrt(n))`` random distinct bins (what ResourcePlacer does)
``jsq``      join the shortest queue: the best of all ``n`` bins

Each strategy runs twice: with *fresh* statistics (the chooser sees current loads) and
with *stale* ones (it sees a snapshot refreshed every ``n`` placements, as a placer
that samples statistics periodically would, while all other placers add work in
between). K = 2 and K = ceil(sqrt n) choose with ``pick_lowest``, the placer's own
function: candidates are sampled in random order and the first lowest wins, so ties
go to a random candidate. JSQ breaks ties at random too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.platform.balancing.placement import choices_for, pick_lowest

if TYPE_CHECKING:
    import numpy as np

STRATEGIES = ("random", "k2", "ksqrt", "jsq")
DEFAULT_SIZES = (2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)


@dataclass(frozen=True, slots=True)
class PlacementStats:
    n: int
    strategy: str
    stale: bool
    max_load: float
    spread: float


def _k(strategy: str, n: int) -> int:
    return {"random": 1, "k2": min(2, n), "ksqrt": choices_for(n), "jsq": n}[strategy]


def place(n: int, balls: int, k: int, rng: np.random.Generator, refresh_every: int) -> list[int]:
    """Final loads after placing ``balls`` with best-of-``k``; snapshot every
    ``refresh_every`` placements (1 = always fresh).

    Best-of-``k`` for ``1 < k < n`` is :func:`conveyor.platform.balancing.placement.pick_lowest`,
    the very function :class:`~conveyor.platform.balancing.placement.ResourcePlacer` chooses with,
    so the simulation measures the production chooser. Two cases are not choices the
    placer makes for ``n >= 3`` and stay vectorised: ``k = 1`` (random) and ``k >= n``
    (join the shortest queue, ties to a random one of the shortest).
    """
    import random

    import numpy as np

    if k == 1:
        picks = rng.integers(n, size=balls)
        return np.bincount(picks, minlength=n).tolist()  # type: ignore[no-any-return]
    if k >= n:
        return _join_shortest_queue(n, balls, rng, refresh_every)
    chooser = random.Random(int(rng.integers(2**63)))
    loads = [0] * n
    view = loads
    for ball in range(balls):
        if refresh_every > 1 and ball % refresh_every == 0:
            view = list(loads)  # the snapshot the chooser sees until the next refresh
        loads[pick_lowest(view, k, chooser)] += 1
    return loads


def _join_shortest_queue(
    n: int, balls: int, rng: np.random.Generator, refresh_every: int
) -> list[int]:
    import numpy as np

    loads = np.zeros(n, dtype=np.int64)
    view = loads.copy()
    for ball in range(balls):
        if ball % refresh_every == 0:
            view[:] = loads
        order = rng.permutation(n)
        i = int(order[np.argmin(view[order])])
        loads[i] += 1
        if refresh_every == 1:
            view[i] += 1
    return [int(v) for v in loads]


def run(
    sizes: Sequence[int] = DEFAULT_SIZES,
    balls_per_bin: int = 10,
    trials: int = 3,
    seed: int = 0,
) -> list[PlacementStats]:
    import numpy as np

    out: list[PlacementStats] = []
    for n in sizes:
        for strategy in STRATEGIES:
            for stale in (False, True):
                maxes: list[int] = []
                spreads: list[int] = []
                for trial in range(trials):
                    rng = np.random.default_rng([seed, n, trial, STRATEGIES.index(strategy)])
                    loads = place(n, balls_per_bin * n, _k(strategy, n), rng, n if stale else 1)
                    maxes.append(max(loads))
                    spreads.append(max(loads) - min(loads))
                out.append(
                    PlacementStats(
                        n=n,
                        strategy=strategy,
                        stale=stale,
                        max_load=float(np.mean(maxes)),
                        spread=float(np.mean(spreads)),
                    )
                )
    return out
