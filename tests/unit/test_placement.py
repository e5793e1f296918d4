"""Resource-aware placement: scoring, K, power-of-K choice, local preference, filtering."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from conveyor.lab.placement_sim import place
from conveyor.platform.balancing.placement import (
    STAT_KEYS,
    PlacementWeights,
    ResourcePlacer,
    choices_for,
    pick_lowest,
    score,
)
from conveyor.workers.resources import ResourceSample, default_sampler, placement_stats

if TYPE_CHECKING:
    from conveyor import WorkerDaemon

GIB = 1024.0**3


def stats(
    cpu: float, used_gib: float = 0.0, avail_gib: float = 8.0, total_gib: float = 8.0
) -> dict[str, float]:
    return {
        "cpu_percent": cpu,
        "memory_used_bytes": used_gib * GIB,
        "memory_available_bytes": avail_gib * GIB,
        "memory_total_bytes": total_gib * GIB,
    }


@pytest.mark.parametrize(
    ("n", "k"), [(1, 1), (2, 2), (3, 2), (4, 2), (5, 3), (100, 10), (1000, 32)]
)
def test_k_grows_with_the_square_root_of_n(n: int, k: int) -> None:
    assert choices_for(n) == k


def test_score_is_the_weighted_sum_of_normalised_terms() -> None:
    w = PlacementWeights(cpu_usage=2, memory_usage=1, available_memory=1)
    s = stats(cpu=50, used_gib=2, avail_gib=6)
    # 0.5 * 0.5 + 0.25 * 0.25 + 0.25 * (1 - 0.75)
    assert score(s, w) == pytest.approx(0.25 + 0.0625 + 0.0625)
    assert score(stats(0, 0, 8), w) == 0.0
    assert score(stats(100, 8, 0), w) == pytest.approx(1.0)


def test_weights_change_the_winner() -> None:
    busy_cpu = stats(cpu=90, used_gib=1, avail_gib=7)
    busy_mem = stats(cpu=10, used_gib=7, avail_gib=1)
    cpu_heavy = PlacementWeights(cpu_usage=1, memory_usage=0, available_memory=0)
    mem_heavy = PlacementWeights(cpu_usage=0, memory_usage=1, available_memory=1)
    assert score(busy_cpu, cpu_heavy) > score(busy_mem, cpu_heavy)
    assert score(busy_cpu, mem_heavy) < score(busy_mem, mem_heavy)


def test_with_k_equal_n_the_lowest_score_always_wins() -> None:
    rng = random.Random(1)
    scores = [0.5, 0.2, 0.9, 0.3]
    assert {pick_lowest(scores, 4, rng) for _ in range(50)} == {1}


def test_power_of_k_never_picks_the_worst_of_k_candidates() -> None:
    rng = random.Random(2)
    scores = [0.9, 0.1, 0.5]
    picks = [pick_lowest(scores, 2, rng) for _ in range(300)]
    assert 0 not in picks  # the worst loses any pair it is in
    assert set(picks) == {1, 2}


def test_local_member_wins_within_the_margin_only() -> None:
    rng = random.Random(3)
    assert pick_lowest([0.30, 0.27], 2, rng, local=0, margin=0.05) == 0
    assert pick_lowest([0.40, 0.27], 2, rng, local=0, margin=0.05) == 1


def test_placer_avoids_a_member_whose_cpu_only_dipped_for_a_moment() -> None:
    placer = ResourcePlacer(rng=random.Random(4))
    for _ in range(200):
        placer.observe("a", stats(cpu=80))
        placer.observe("b", stats(cpu=55))
    placer.observe("a", stats(cpu=5))  # a stall, not idleness
    placer.observe("b", stats(cpu=55))
    assert placer.choose() == "b"
    # an unfiltered look would have picked "a"
    assert score(stats(cpu=5), placer.weights) < score(stats(cpu=55), placer.weights)


def test_placer_sees_new_load_at_once() -> None:
    placer = ResourcePlacer(rng=random.Random(5))
    noise = np.random.default_rng(5)
    for _ in range(200):  # real CPU readings jitter
        placer.observe("a", stats(cpu=20 + noise.normal(0, 2)))
        placer.observe("b", stats(cpu=40 + noise.normal(0, 2)))
    placer.observe("a", stats(cpu=95))
    assert placer.choose() == "b"


def test_placer_prefers_local_when_close() -> None:
    placer = ResourcePlacer(rng=random.Random(6))
    placer.observe("local", stats(cpu=42))
    placer.observe("other", stats(cpu=40))
    assert placer.choose(local="local") == "local"
    assert placer.choose() == "other"


def test_choose_refuses_an_empty_cluster() -> None:
    with pytest.raises(ValueError, match="no members"):
        ResourcePlacer().choose([])


@pytest.mark.parametrize("n", [10, 100])
def test_power_of_k_beats_random_on_max_load(n: int) -> None:
    balls = 10 * n
    rng = np.random.default_rng(0)
    random_max = max(place(n, balls, 1, rng, refresh_every=1))
    ksqrt_max = max(place(n, balls, choices_for(n), rng, refresh_every=1))
    k2_max = max(place(n, balls, 2, rng, refresh_every=1))
    assert ksqrt_max < random_max
    assert k2_max < random_max
    assert ksqrt_max <= k2_max


def test_place_conserves_balls() -> None:
    loads = place(20, 333, 4, np.random.default_rng(1), refresh_every=20)
    assert sum(loads) == 333 and len(loads) == 20


class ScriptedSampler:
    """A resource sampler (the daemon's injectable one) that replays CPU fractions and
    reports fixed memory: 2 GiB used, 5 GiB available of an 8 GiB limit."""

    def __init__(self, cpu: list[float]) -> None:
        self.cpu = cpu
        self.calls = 0

    def sample(self) -> ResourceSample:
        cpu = self.cpu[self.calls]
        self.calls += 1
        return ResourceSample(
            cpu=cpu, memory=0.25, memory_used_bytes=2 * GIB,
            memory_limit_bytes=8 * GIB, memory_available_bytes=5 * GIB,
        )


def memory_daemon(name: str, **kw: Any) -> WorkerDaemon:
    from conveyor import App, WorkerDaemon, load_config
    from conveyor.adapters.memory import MemoryAdapter, reset_broker

    reset_broker(name)
    cfg = load_config(environ={}, overrides={"memory": {"broker": name}})
    return WorkerDaemon(App(name), cfg, adapter=MemoryAdapter(name), **kw)


def test_a_daemon_publishes_cdm_kf_filtered_cpu_so_a_short_stall_is_damped() -> None:
    """WorkerDaemon.stats_snapshot (what a daemon publishes with its membership) carries
    its resource sampler's CPU, CDM-KF-filtered: a 5-sample stall from 60 % to 5 % barely
    moves it. Memory is published in bytes of the sampler's limit."""
    load = [0.60 + (0.03 if i % 2 else -0.03) for i in range(40)]
    sampler = ScriptedSampler([*load, *[0.05] * 5])
    daemon = memory_daemon("i6-kf", resource_sampler=sampler)
    published = [daemon.stats_snapshot() for _ in range(45)]
    assert sampler.calls == len(sampler.cpu)  # each snapshot took one sample
    before = published[39]["cpu_percent"]
    during = [s["cpu_percent"] for s in published[40:]]
    assert before >= 55.0  # followed the 57-63 % load
    # raw fell by 55 points; the published value falls by under a fifth of that
    assert min(during) >= before - 0.2 * (before - 5.0)
    for s in published:
        assert s["memory_total_bytes"] == 8 * GIB
        assert s["memory_used_bytes"] == pytest.approx(2 * GIB)
        assert 0.0 < s["memory_available_bytes"] <= s["memory_total_bytes"]


def test_a_sample_becomes_placement_stats_in_percent_and_bytes_of_the_limit() -> None:
    sample = ResourceSample(cpu=0.42, memory=0.25, memory_used_bytes=2 * GIB,
                            memory_limit_bytes=8 * GIB, memory_available_bytes=5 * GIB)
    assert placement_stats(sample) == {
        "cpu_percent": 42.0, "memory_used_bytes": 2 * GIB,
        "memory_available_bytes": 5 * GIB, "memory_total_bytes": 8 * GIB,
    }
    assert set(placement_stats(sample)) == set(STAT_KEYS)
    # a sampler that gives no bytes scores on CPU alone
    assert score(placement_stats(ResourceSample(cpu=0.5, memory=0.9)), PlacementWeights()) == 0.25


def test_a_daemon_samples_placement_with_the_resource_slots_sampler() -> None:
    """By default a daemon publishes what default_sampler reads (cgroup v2 where this
    process has one, else the host): memory in bytes of that sampler's limit."""
    daemon = memory_daemon("i6-default")
    published = daemon.stats_snapshot()
    limit = default_sampler().sample().memory_limit_bytes
    assert published["memory_total_bytes"] == limit > 0
    assert 0.0 < published["memory_used_bytes"] < limit
    assert 0.0 < published["memory_available_bytes"] <= limit
    assert 0.0 <= published["cpu_percent"] <= 100.0


def test_the_placement_simulation_chooses_with_the_placers_own_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conveyor.lab.placement_sim as placement_sim
    import conveyor.platform.balancing.placement as placement

    assert placement_sim.pick_lowest is placement.pick_lowest
    calls: list[int] = []

    def spy(scores: list[int], k: int, rng: random.Random) -> int:
        calls.append(k)
        return placement.pick_lowest(scores, k, rng)

    monkeypatch.setattr(placement_sim, "pick_lowest", spy)
    loads = place(100, 1000, choices_for(100), np.random.default_rng(0), refresh_every=1)
    assert calls == [10] * 1000
    assert sum(loads) == 1000
