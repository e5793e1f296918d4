"""Resource-aware placement: power-of-K choices over CDM-KF-filtered daemon statistics.

A balancer that must put new work (a queue, a cell, a worker process) on one of ``n``
daemons calls :meth:`ResourcePlacer.choose`. It samples ``K = ceil(sqrt(n))`` distinct
candidates (K = 2 is the classic "power of two choices"; K = n is join-the-shortest-
queue; growing K with √n keeps choices good in large clusters at a cost that grows
slower than n), scores each candidate and takes the lowest score.

Score of a daemon (lower is better), from its *filtered* statistics::

    score = w_cpu · cpu_percent / 100
          + w_mem · memory_used / memory_total
          + w_avail · (1 - memory_available / memory_total)

Each term is normalised to [0, 1] and the weights are normalised to sum to 1, so each
statistic contributes in proportion to its weight whatever its unit. Statistics pass
through one :class:`~conveyor.platform.balancing.kalman.CDMKalmanFilter` per daemon and statistic
before scoring: a daemon whose CPU dips for a moment does not suddenly look idle.

Local preference: if the caller names its own daemon (``local``) and that daemon's
score is within ``local_margin`` of the best candidate's, the local daemon wins (work
stays where it was asked for unless somewhere is clearly better).

Member statistics are plain ``Mapping[str, float]`` with the keys of :data:`STAT_KEYS`
(missing keys count as 0; a missing or zero ``memory_total_bytes`` makes both memory
terms 0), so any membership store can feed them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conveyor.platform.balancing.kalman import CDMKalmanFilter
from conveyor.platform.errors import InvalidArgumentError

STAT_KEYS = ("cpu_percent", "memory_used_bytes", "memory_available_bytes", "memory_total_bytes")

MemberStats = Mapping[str, float]


@dataclass(frozen=True, slots=True)
class PlacementWeights:
    """Relative weights (any non-negative numbers; normalised to sum to 1)."""

    cpu_usage: float = 0.5
    memory_usage: float = 0.25
    available_memory: float = 0.25
    local_margin: float = 0.05
    """Score handicap the local daemon may have and still be chosen."""

    def __post_init__(self) -> None:
        values = (self.cpu_usage, self.memory_usage, self.available_memory, self.local_margin)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise InvalidArgumentError(f"placement weights must be finite and >= 0, got {self!r}")
        if self.cpu_usage + self.memory_usage + self.available_memory == 0:
            raise InvalidArgumentError("at least one placement weight must be > 0")

    def normalised(self) -> tuple[float, float, float]:
        total = self.cpu_usage + self.memory_usage + self.available_memory
        return (self.cpu_usage / total, self.memory_usage / total, self.available_memory / total)


def choices_for(n: int) -> int:
    """K for ``n`` members: ``ceil(sqrt(n))``, at least 1 and at most ``n``."""
    if n < 1:
        raise InvalidArgumentError(f"need at least one member, got {n}")
    return min(n, max(1, math.ceil(math.sqrt(n))))


def score(stats: MemberStats, weights: PlacementWeights) -> float:
    """The normalised weighted score of one member (lower is better)."""
    w_cpu, w_mem, w_avail = weights.normalised()
    cpu = min(max(stats.get("cpu_percent", 0.0) / 100.0, 0.0), 1.0)
    total = stats.get("memory_total_bytes", 0.0)
    if total > 0:
        used = min(max(stats.get("memory_used_bytes", 0.0) / total, 0.0), 1.0)
        avail = min(max(stats.get("memory_available_bytes", 0.0) / total, 0.0), 1.0)
        return w_cpu * cpu + w_mem * used + w_avail * (1.0 - avail)
    return w_cpu * cpu


def pick_lowest(
    scores: Sequence[float],
    k: int,
    rng: random.Random,
    local: int | None = None,
    margin: float = 0.0,
) -> int:
    """Power-of-K choice over ``scores``: index of the lowest-scored of ``k`` distinct
    random candidates; ``local`` (an index) wins if within ``margin`` of that best."""
    n = len(scores)
    if n == 0:
        raise InvalidArgumentError("no members to choose from")
    k = min(max(k, 1), n)
    candidates = rng.sample(range(n), k) if k < n else range(n)
    best = min(candidates, key=scores.__getitem__)
    if local is not None and scores[local] - margin <= scores[best]:
        return local
    return best


class ResourcePlacer:
    """Keeps filtered statistics per member and chooses where new work goes.

    Not thread-safe; one per balancer. ``observe`` costs three constant-time filter
    updates; ``choose`` costs O(K) scores plus an O(n) member list.
    """

    def __init__(self, weights: PlacementWeights | None = None, rng: random.Random | None = None):
        self.weights = weights if weights is not None else PlacementWeights()
        self._rng = rng if rng is not None else random.Random()
        self._filters: dict[str, tuple[CDMKalmanFilter, CDMKalmanFilter, CDMKalmanFilter]] = {}
        self._filtered: dict[str, dict[str, float]] = {}

    def observe(self, member: str, stats: MemberStats) -> Mapping[str, float]:
        """Feed one statistics sample of ``member``; return its filtered statistics."""
        filters = self._filters.get(member)
        if filters is None:
            filters = (CDMKalmanFilter(), CDMKalmanFilter(), CDMKalmanFilter())
            self._filters[member] = filters
        cpu_f, used_f, avail_f = filters
        total = stats.get("memory_total_bytes", 0.0)
        filtered = {
            "cpu_percent": cpu_f.update(stats.get("cpu_percent", 0.0)),
            "memory_used_bytes": used_f.update(stats.get("memory_used_bytes", 0.0)),
            # filtered as a *shortage* (total - available), so the filter's slow fall
            # protects against a momentary rise of available memory, the dangerous side
            "memory_available_bytes": total
            - avail_f.update(total - stats.get("memory_available_bytes", 0.0)),
            "memory_total_bytes": total,
        }
        self._filtered[member] = filtered
        return filtered

    def forget(self, member: str) -> None:
        """Drop a member that left (its filters restart from scratch if it returns)."""
        self._filters.pop(member, None)
        self._filtered.pop(member, None)

    def scores(self) -> dict[str, float]:
        return {m: score(s, self.weights) for m, s in self._filtered.items()}

    def choose(self, members: Sequence[str] | None = None, local: str | None = None) -> str:
        """Pick a member for new work among ``members`` (default: all observed ones).

        Members never observed score as if idle (0) — a fresh daemon is a good target —
        which is also what an unfiltered placer would do.
        """
        names = list(members) if members is not None else sorted(self._filtered)
        if not names:
            raise InvalidArgumentError("no members to choose from")
        empty: dict[str, float] = {}
        scores = [score(self._filtered.get(m, empty), self.weights) for m in names]
        local_index = names.index(local) if local is not None and local in names else None
        i = pick_lowest(
            scores, choices_for(len(names)), self._rng, local_index, self.weights.local_margin
        )
        return names[i]


def resource_split(
    member_stats: Mapping[str, MemberStats],
    total_queues: int,
    owners: Mapping[int, str],
    weights: PlacementWeights,
) -> dict[str, list[int]]:
    """Hand queues to members by power-of-K choices over their published statistics.

    Every daemon that reads the same members, statistics and owners computes the same
    split, so the balancer can run it everywhere without a leader:

    * queues are placed in order ``0..total_queues-1``; for each, ``K = ceil(sqrt(n))``
      candidates are drawn with a generator seeded by the queue number and the member
      ids (deterministic across processes: ``random.Random`` hashes a ``str`` seed with
      SHA-512, never with the salted ``hash()``);
    * a candidate's cost is its resource score plus the queues it was already given,
      in units of the fair share ``ceil(q/n)`` — so queues spread out, and a daemon
      with a worse score ends up with fewer of them (at most one fair share fewer or
      more than an idle one), never more than twice the fair share;
    * local preference: the queue's current owner keeps it while its cost is within
      ``weights.local_margin`` of the best candidate's, so small changes in the
      statistics do not move queues (each move is a drain and a hand-off).

    Statistics are expected already smoothed by the daemon that published them (CDM-KF,
    see :class:`ResourcePlacer`), so that all readers score from identical numbers.
    """
    ids = sorted(member_stats)
    split: dict[str, list[int]] = {m: [] for m in ids}
    if not ids:
        return split
    n = len(ids)
    fair = math.ceil(total_queues / n)
    cap = 2 * fair
    base = {m: score(member_stats[m], weights) for m in ids}
    k = choices_for(n)
    view = ",".join(ids)

    def cost(member: str) -> float:
        return base[member] + len(split[member]) / fair

    for queue in range(total_queues):
        rng = random.Random(f"{queue}|{view}")
        open_ids = [m for m in ids if len(split[m]) < cap]
        candidates = rng.sample(open_ids, min(k, len(open_ids)))
        best = min(candidates, key=lambda m: (cost(m), m))
        owner = owners.get(queue)
        if (
            owner in split
            and owner is not None
            and len(split[owner]) < cap
            and cost(owner) - weights.local_margin <= cost(best)
        ):
            best = owner
        split[best].append(queue)
    return split
