"""Arrival patterns: reproducible, the right rates and shapes, replay files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conveyor.lab.patterns import PATTERNS, ArrivalsFileError, generate, load_arrivals


def per_second(times: np.ndarray, duration_s: float = 60.0) -> np.ndarray:
    return np.bincount(times.astype(int), minlength=int(duration_s))[: int(duration_s)]


@pytest.mark.parametrize("name", PATTERNS)
def test_patterns_are_sorted_in_range_and_reproducible(name: str) -> None:
    a = generate(name, seed=5)
    assert len(a) > 0
    assert np.all(np.diff(a) >= 0)
    assert a[0] >= 0 and a[-1] < 60.0
    np.testing.assert_array_equal(a, generate(name, seed=5))


@pytest.mark.parametrize("name", ["periodic", "burst", "chaotic", "poisson"])
def test_random_patterns_change_with_the_seed(name: str) -> None:
    assert not np.array_equal(generate(name, seed=1), generate(name, seed=2))


def test_constant_is_evenly_spaced_at_the_base_rate() -> None:
    a = generate("constant", seed=0)
    np.testing.assert_allclose(np.diff(a), 0.01)
    assert len(a) == pytest.approx(6000, abs=1)


def test_periodic_drops_to_a_tenth_in_the_quiet_windows() -> None:
    counts = per_second(generate("periodic", seed=0))
    busy = np.r_[counts[1:15], counts[31:45]].mean()
    quiet = np.r_[counts[16:30], counts[46:60]].mean()
    assert 80 < busy < 110
    assert quiet == pytest.approx(busy / 10, rel=0.3)


def test_ramp_peaks_at_half_time() -> None:
    counts = per_second(generate("ramp", seed=0))
    assert int(np.argmax(counts)) in range(27, 33)
    assert counts[28:32].mean() == pytest.approx(100, rel=0.1)
    assert counts[14:16].mean() == pytest.approx(50, rel=0.15)
    assert counts[:2].sum() < 10 and counts[-2:].sum() < 10


def test_spike_sends_five_messages_within_fifty_ms_every_ten_s() -> None:
    a = generate("spike", seed=0)
    groups = a.reshape(-1, 5)
    assert len(groups) == 5  # at 10, 20, 30, 40, 50 s
    np.testing.assert_allclose(np.floor(groups[:, 0] / 10) * 10, [10, 20, 30, 40, 50])
    assert np.all(groups.max(axis=1) - groups.min(axis=1) < 0.05)


def test_burst_starts_at_five_times_the_rate_and_goes_quiet() -> None:
    counts = per_second(generate("burst", seed=0))
    assert counts[0] == pytest.approx(500, abs=2)
    quiet_seconds = int((counts == 0).sum())
    assert quiet_seconds > 20  # gaps of U(5, 15) s between bursts
    assert counts.max() <= 510


def test_chaotic_has_a_low_base_with_bursts() -> None:
    counts = per_second(generate("chaotic", seed=0))
    assert np.median(counts) < 200
    assert counts.max() > 50
    assert (counts <= 20).sum() > 0  # base-rate stretches of ~10 msg/s


def test_poisson_has_rate_lambda_and_exponential_gaps() -> None:
    a = generate("poisson", seed=0)
    gaps = np.diff(a)
    assert len(a) / 60 == pytest.approx(100, rel=0.05)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)  # exponential: sd = mean


def test_unknown_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pattern"):
        generate("square", 0)


def test_replay_file_is_read_sorted_with_comments(tmp_path: Path) -> None:
    f = tmp_path / "arrivals.txt"
    f.write_text("# seconds\n0.5\n\n0.1\n2.25  # late\n")
    np.testing.assert_array_equal(load_arrivals(f), [0.1, 0.5, 2.25])


@pytest.mark.parametrize("content", ["0.1\nabc\n", "-1\n", "", "nan\n"])
def test_bad_replay_files_are_refused_with_the_line(tmp_path: Path, content: str) -> None:
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(ArrivalsFileError):
        load_arrivals(f)


@pytest.mark.parametrize("line", ["1e309", "inf", "nan", "-1"])
def test_an_arrival_time_that_is_no_finite_time_says_so(tmp_path: Path, line: str) -> None:
    # 1e309 (infinity) was refused as "arrival time must be >= 0, got 1e309".
    f = tmp_path / "bad.txt"
    f.write_text(f"0.5\n{line}\n")
    with pytest.raises(ArrivalsFileError) as refused:
        load_arrivals(f)
    assert str(refused.value) == (
        f"{f}:2: an arrival time is a finite number of seconds >= 0, got {line}")
