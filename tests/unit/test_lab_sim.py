"""The pool simulation's bookkeeping and the static/dynamic behaviours."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.lab.patterns import PATTERNS, generate
from conveyor.lab.sim import SimConfig, compare, simulate, step_counts

SHORT = SimConfig(duration_s=20.0)


def burst_then_quiet(n: int = 400, at_s: float = 1.0) -> np.ndarray:
    return np.full(n, at_s) + np.linspace(0.0, 0.05, n)


@pytest.mark.parametrize("name", PATTERNS)
def test_every_message_is_processed_or_still_in_the_pool(name: str) -> None:
    arrivals = generate(name, seed=3, duration_s=SHORT.duration_s)
    cmp = compare(arrivals, SHORT, seed=3)
    for trace in (cmp.static, cmp.dynamic):
        assert trace.arrived == len(arrivals)
        assert trace.arrived == trace.completed + trace.in_pool
        assert trace.workers.max() <= SHORT.max_workers


def test_messages_queue_only_when_the_pool_is_full() -> None:
    config = SimConfig(duration_s=5.0, max_workers=10)
    (trace,) = simulate(burst_then_quiet(100), config, None)
    first = int(np.argmax(trace.rate > 0))
    assert trace.workers[first] == 10
    assert trace.queue_length[first] > 0
    assert trace.queue_length[-1] == 0 and trace.completed == 100


def test_fewest_waiting_spreads_the_overflow_evenly() -> None:
    config = SimConfig(duration_s=1.0, max_workers=4, service_s=10.0, service_jitter=0.0)
    (trace,) = simulate(np.zeros(10), config, None)
    # 10 messages on 4 workers: waiting counts 3, 3, 2, 2 -> mean 2.5, 6 not started
    assert trace.avg_waiting[0] == pytest.approx(2.5)
    assert trace.queue_length[0] == 6


def test_idle_workers_are_reused_before_new_ones_are_created() -> None:
    config = SimConfig(duration_s=10.0, service_jitter=0.0, service_s=0.05)
    arrivals = np.arange(0.0, 10.0, 0.5)  # one message every 5 steps, each done in one
    (trace,) = simulate(arrivals, config, None)
    assert trace.workers.max() == 1


def test_static_pool_never_shrinks() -> None:
    for name in ("burst", "chaotic", "spike"):
        (trace,) = simulate(generate(name, seed=1), SimConfig(), None)
        assert np.all(np.diff(trace.workers) >= 0)


def test_dynamic_pool_shrinks_back_during_cooldown() -> None:
    config = SimConfig(duration_s=40.0)
    cmp = compare(burst_then_quiet(), config)
    assert cmp.static.workers[-1] == 50
    peak = int(cmp.dynamic.workers.max())
    assert peak == 50
    assert cmp.dynamic.workers[-1] < 0.5 * peak
    # removals are paced: by the dead zone and back-off, at most one per second; once
    # workers have been idle past the keep-alive (5 s), one per back-off (0.5 s)
    drops = -np.diff(cmp.dynamic.workers)
    removal_steps = np.flatnonzero(drops > 0)
    assert np.all(drops <= 1)
    gaps_s = np.diff(removal_steps) * config.step_s
    assert np.all(gaps_s >= config.policy.backoff_s - 1e-9)
    assert np.all(gaps_s[:3] >= 1.0 - 1e-9)  # before the keep-alive: the PID path alone


def test_a_spike_between_inspections_comes_to_rest_after_the_keepalive() -> None:
    """The reference's spike: done before an inspection sees it, so the PID signal stays
    0; the keep-alive still brings the pool back to nothing, and no sooner."""
    config = SimConfig(duration_s=60.0)  # 5 messages every 10 s
    cmp = compare(generate("spike", seed=0, duration_s=60.0), config)
    workers, busy = cmp.dynamic.workers, cmp.dynamic.busy
    assert cmp.static.workers[-1] == cmp.static.workers.max() > 0  # static never shrinks
    assert cmp.dynamic.avg_workers < cmp.static.avg_workers
    per_10s = int(10.0 / config.step_s)
    for start in range(0, config.steps - per_10s + 1, per_10s):
        assert workers[start:start + per_10s].min() == 0  # at rest before the next spike
    for drop in np.flatnonzero(np.diff(workers) < 0) + 1:
        last_busy = int(np.flatnonzero(busy[:drop] > 0)[-1])
        # one inspection period of slack: inspections fall every 0.5 s
        assert (drop - last_busy) * config.step_s >= config.policy.idle_keepalive_s - 0.5


def test_batch_members_are_independent_of_each_other() -> None:
    arrivals = generate("chaotic", seed=2, duration_s=20.0)
    gains = [(0.433, 0.468, 0.48), (0.0, 0.0, 1.0), (1.0, 0.1, 0.0)]
    together = simulate(arrivals, SHORT, gains, seed=2)
    for g, trace in zip(gains, together, strict=True):
        (alone,) = simulate(arrivals, SHORT, [g], seed=2)
        np.testing.assert_array_equal(alone.workers, trace.workers)


def test_arrivals_are_counted_per_step_and_late_ones_dropped() -> None:
    config = SimConfig(duration_s=1.0)
    counts = step_counts(np.array([0.0, 0.05, 0.1, 0.95, 1.0, 7.0]), config)
    assert counts.tolist() == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_littles_law_busy_workers_equal_rate_times_mean_service_time() -> None:
    # Constant 100 msg/s, 0.1 s mean service: 10 Erlangs. A model that kept a worker
    # busy until the end of a 0.1 s step would show about 15 (1.5 steps per message).
    config = SimConfig()
    arrivals = generate("constant", seed=0, duration_s=config.duration_s)
    rate = len(arrivals) / config.duration_s
    for trace in (compare(arrivals, config).static, compare(arrivals, config).dynamic):
        assert trace.avg_busy == pytest.approx(rate * config.service_s, rel=0.03)
        # and the time a message spends in the pool is its service time: none queue
        assert trace.avg_queue_length == 0.0


def test_a_worker_freed_mid_step_takes_a_later_message_of_the_same_step() -> None:
    config = SimConfig(duration_s=1.0, service_s=0.03, service_jitter=0.0)
    # three messages inside the first 0.1 s step, each arriving after the last finished
    (trace,) = simulate(np.array([0.0, 0.03, 0.06]), config, None)
    assert trace.workers.max() == 1
    assert trace.busy[0] == pytest.approx(3 * 0.03 / 0.1)
    assert trace.completed == 3 and trace.busy[1] == 0.0


def test_the_simulation_drives_the_shared_scale_down_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dynamic run calls conveyor.workers.pools.scaledown.ScaleDownController.inspect —
    the object the real pool uses — and removes a worker exactly when it says so."""
    from conveyor.workers.pools import scaledown

    original = scaledown.ScaleDownController.inspect
    calls: list[tuple[float, bool]] = []

    def spy(self: scaledown.ScaleDownController, now_s: float, avg: float, idle: int,
            idle_for_s: float = 0.0) -> bool:
        verdict = original(self, now_s, avg, idle, idle_for_s)
        calls.append((now_s, verdict))
        return verdict

    monkeypatch.setattr(scaledown.ScaleDownController, "inspect", spy)
    config = SimConfig(duration_s=20.0)
    (trace,) = simulate(burst_then_quiet(), config, [(0.433, 0.468, 0.48)])
    assert len(calls) == config.steps // config.inspection_every - 1 + (
        config.steps % config.inspection_every > 0
    )
    removals = [t for t, verdict in calls if verdict]
    drops = np.flatnonzero(np.diff(trace.workers) < 0) + 1  # steps whose count fell
    assert len(removals) > 0
    assert [round(trace.time_s[i] - config.step_s, 6) for i in drops] == [
        round(t, 6) for t in removals
    ]
