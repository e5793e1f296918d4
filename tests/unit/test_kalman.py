"""CDM-KF: falls slowly after a short drop, rises fast, constant state and cost."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from conveyor.platform.balancing import kalman
from conveyor.platform.balancing.kalman import (
    CDMKalmanFilter,
    Regime,
    ScalarKalmanFilter,
    cdm_filter,
    single_filter,
)


def noisy(level: float, n: int, rng: np.random.Generator, sd: float = 3.0) -> list[float]:
    return [float(v) for v in level + rng.normal(0.0, sd, n)]


def test_scalar_filter_is_the_textbook_recursion() -> None:
    flt = ScalarKalmanFilter(q=0.01)
    # P = 1 + 0.01, K = 1.01 / 2.01, x = K * 10
    assert flt.update(10.0) == pytest.approx(10.0 * 1.01 / 2.01)
    assert flt.error == pytest.approx((1 - 1.01 / 2.01) * 1.01)


def test_a_short_deep_drop_moves_the_output_far_less_than_the_input() -> None:
    rng = np.random.default_rng(7)
    before = noisy(60.0, 500, rng)
    signal = [*before, *([10.0] * 15), *noisy(60.0, 100, rng)]
    out = cdm_filter(signal)
    level = out[499]
    fall_out = level - min(out[500:515])
    fall_in = float(np.mean(before[-50:])) - 10.0
    assert fall_out < 0.25 * fall_in


def test_a_short_drop_in_a_clean_signal_still_falls_less_than_half() -> None:
    out = cdm_filter([60.0] * 500 + [10.0] * 5 + [60.0] * 10)
    assert 60.0 - min(out) < 0.5 * 50.0
    assert out[505] == pytest.approx(60.0)  # back up at once when the stall ends


def test_the_cdm_filter_falls_slower_than_the_fast_filter_alone() -> None:
    signal = [60.0] * 500 + [10.0] * 15
    assert min(cdm_filter(signal)) > min(single_filter(signal, q=0.01)) + 5.0


def test_a_rise_from_a_noisy_level_is_followed_within_two_samples() -> None:
    rng = np.random.default_rng(3)
    out = cdm_filter(noisy(20.0, 300, rng) + noisy(80.0, 10, rng))
    assert out[301] > 20.0 + 0.9 * 60.0


def test_a_rise_after_a_fall_is_followed_at_once() -> None:
    flt = CDMKalmanFilter()
    for z in [80.0] * 200 + [20.0] * 200:
        flt.update(z)
    regimes = [flt.regime]
    assert flt.update(80.0) == pytest.approx(80.0)
    regimes.append(flt.regime)
    assert regimes == [Regime.SLOW, Regime.FAST]


def test_a_sustained_fall_is_followed_slowly_but_surely() -> None:
    out = cdm_filter([80.0] * 300 + [20.0] * 300)
    assert out[305] > 50.0  # slow at first
    assert out[-1] < 25.0  # but not frozen


def test_unlike_a_lone_slow_filter_it_does_not_sink_to_the_lifetime_average() -> None:
    t = np.arange(2500)
    wave = [float(v) for v in 50 + 40 * np.sin(2 * math.pi * t / 250)]
    cdm = cdm_filter(wave)
    slow = single_filter(wave, q=0.0)
    last_crest = slice(2000, 2250)
    assert max(cdm[last_crest]) > 85.0
    assert max(slow[last_crest]) < 60.0


def test_state_and_memory_do_not_grow_with_samples() -> None:
    flt = CDMKalmanFilter()
    rng = np.random.default_rng(0)
    samples = [float(v) for v in rng.uniform(0, 100, 50_000)]
    for z in samples[:1000]:
        flt.update(z)
    assert not hasattr(flt, "__dict__")
    # Only what the filter's own code allocates counts: threads earlier tests left
    # running in this process (span exporters, pools) allocate meanwhile too.
    own = [tracemalloc.Filter(True, kalman.__file__)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(own)
        for z in samples:
            flt.update(z)
        after = tracemalloc.take_snapshot().filter_traces(own)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 1024


def test_reset_forgets_everything() -> None:
    flt = CDMKalmanFilter()
    first = [flt.update(z) for z in (5.0, 50.0, 1.0)]
    flt.reset()
    assert flt.value == 0.0
    assert [flt.update(z) for z in (5.0, 50.0, 1.0)] == first


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_measurements_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        CDMKalmanFilter().update(bad)
