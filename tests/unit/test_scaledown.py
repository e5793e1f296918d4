"""The scale-down loop: sign of the PID signal, dead zone, back-off and anti-windup."""

from __future__ import annotations

import itertools

import pytest

from conveyor.platform.errors import HandlerDeclarationError
from conveyor.platform.options import PoolOptions
from conveyor.workers.pools.scaledown import ScaleDownController, ScaleDownPolicy

PERIOD = 0.5


def drive(
    ctl: ScaleDownController, waiting: list[float], idle: int, start_s: float = 0.0
) -> list[bool]:
    return [ctl.inspect(start_s + i * PERIOD, avg, idle) for i, avg in enumerate(waiting)]


def test_a_pool_that_never_had_waiting_work_is_never_shrunk() -> None:
    ctl = ScaleDownController()
    assert not any(drive(ctl, [0.0] * 50, idle=10))
    assert ctl.signal == 0.0


def test_signal_is_the_reference_pid_on_minus_average_waiting() -> None:
    policy = ScaleDownPolicy(kp=0.4, ki=0.3, kd=0.2)
    ctl = ScaleDownController(policy)
    ctl.inspect(0.0, 2.0, idle_workers=0)
    # e=-2, I=-2, D=(-2-0)/1
    assert ctl.signal == pytest.approx(0.4 * -2 + 0.3 * -2 + 0.2 * -2)
    ctl.inspect(0.5, 1.0, idle_workers=0)
    # e=-1, I=-3, D=+1
    assert ctl.signal == pytest.approx(0.4 * -1 + 0.3 * -3 + 0.2 * 1)


def test_time_is_counted_in_inspection_periods() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(kp=0.0, ki=1.0, kd=0.0))
    ctl.inspect(10.0, 1.0, 0)  # first call counts as one period: I = -1
    ctl.inspect(11.0, 1.0, 0)  # two periods late: I += -2
    assert ctl.pid.integral == pytest.approx(-3.0)


def test_dead_zone_needs_consecutive_negative_cycles() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(dead_zone_cycles=3, backoff_s=0.0))
    assert drive(ctl, [1.0, 1.0], idle=5) == [False, False]
    assert ctl.negative_cycles == 2
    assert ctl.inspect(1.0, 1.0, 5) is True
    assert ctl.negative_cycles == 0


def test_a_non_negative_signal_resets_the_dead_zone() -> None:
    # pure derivative control: a falling waiting count gives a positive signal
    ctl = ScaleDownController(
        ScaleDownPolicy(kp=0.0, ki=0.0, kd=1.0, dead_zone_cycles=2, backoff_s=0.0)
    )
    assert ctl.inspect(0.0, 4.0, 5) is False  # D < 0: one negative cycle
    assert ctl.inspect(0.5, 1.0, 5) is False  # D > 0: counter reset
    assert ctl.negative_cycles == 0
    assert ctl.inspect(1.0, 3.0, 5) is False  # D < 0: one again, not two
    assert ctl.negative_cycles == 1


def test_removal_scales_integral_by_n_minus_one_over_n() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(dead_zone_cycles=1, backoff_s=0.0))
    assert ctl.inspect(0.0, 2.0, idle_workers=4) is True
    # I was -2 after the update; one of four idle workers removed -> -2 * 3/4
    assert ctl.pid.integral == pytest.approx(-1.5)


def test_removing_the_last_idle_worker_discharges_the_integral() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(dead_zone_cycles=1, backoff_s=0.0))
    drive(ctl, [3.0, 3.0, 3.0], idle=0)
    assert ctl.pid.integral == pytest.approx(-9.0)
    assert ctl.inspect(1.5, 0.0, idle_workers=1) is True
    assert ctl.pid.integral == 0.0
    # no more evidence of surplus: quiet pool keeps its workers
    assert not any(drive(ctl, [0.0] * 10, idle=1, start_s=2.0))


def test_no_idle_worker_means_no_removal_and_no_anti_windup() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(dead_zone_cycles=1, backoff_s=0.0))
    assert not any(drive(ctl, [2.0] * 4, idle=0))
    assert ctl.pid.integral == pytest.approx(-8.0)


def test_back_off_spaces_removals() -> None:
    policy = ScaleDownPolicy(dead_zone_cycles=1, backoff_s=2.0)
    ctl = ScaleDownController(policy)
    removals = [i * PERIOD for i, removed in enumerate(drive(ctl, [1.0] * 20, idle=50)) if removed]
    # steady load, dead zone of one cycle: exactly one removal per back-off period
    assert removals == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_back_off_is_not_stretched_by_float_error() -> None:
    # 0.7 - 0.2 computes as 0.49999999999999994: a strict comparison would hold the
    # removal due exactly one back-off later for a whole extra period.
    policy = ScaleDownPolicy(dead_zone_cycles=1, backoff_s=0.5)
    ctl = ScaleDownController(policy)
    assert ctl.inspect(0.2, 1.0, idle_workers=10)
    assert ctl.inspect(0.7, 1.0, idle_workers=9)


def test_defaults_remove_at_most_one_worker_per_second_after_load() -> None:
    ctl = ScaleDownController()
    # 5 s of load, then 20 s quiet with 30 idle workers
    drive(ctl, [1.0] * 10, idle=0)
    decisions = drive(ctl, [0.0] * 40, idle=30, start_s=5.0)
    times = [5.0 + i * PERIOD for i, d in enumerate(decisions) if d]
    assert times, "an integral built up under load must lead to removals once idle"
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))


def test_integral_keeps_accumulating_during_back_off() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(kp=0, ki=1, kd=0, dead_zone_cycles=1, backoff_s=10))
    assert ctl.inspect(0.0, 1.0, 3) is True  # I = -1 * 2/3
    ctl.inspect(0.5, 1.0, 3)
    ctl.inspect(1.0, 1.0, 3)
    assert ctl.pid.integral == pytest.approx(-2.0 / 3.0 - 2.0)


def test_clock_must_move_forward() -> None:
    ctl = ScaleDownController()
    ctl.inspect(1.0, 0.0, 0)
    with pytest.raises(ValueError, match="forward"):
        ctl.inspect(1.0, 0.0, 0)


def test_reset_restarts_the_loop() -> None:
    ctl = ScaleDownController(ScaleDownPolicy(dead_zone_cycles=1, backoff_s=100.0))
    assert ctl.inspect(0.0, 1.0, 2) is True
    ctl.reset()
    assert ctl.inspect(0.0, 1.0, 2) is True


@pytest.mark.parametrize(
    "kwargs",
    [{"kp": -1.0}, {"inspection_period_s": 0.0}, {"dead_zone_cycles": 0}, {"backoff_s": -1.0},
     {"inspection_period_s": 1e-6},  # the collector would spin the event loop
     {"kp": 0.0, "ki": 0.0, "kd": 0.0, "idle_keepalive_s": 0.0},  # would never remove
     {"kd": float("nan")}],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(HandlerDeclarationError, match="ScaleDownPolicy"):
        ScaleDownPolicy(**kwargs)  # type: ignore[arg-type]


def test_zero_gains_are_accepted_while_the_keepalive_can_still_remove() -> None:
    policy = ScaleDownPolicy(kp=0.0, ki=0.0, kd=0.0, dead_zone_cycles=1, backoff_s=0.0,
                             idle_keepalive_s=1.0)
    ctl = ScaleDownController(policy)
    assert not ctl.inspect(0.0, 0.0, 1, idle_for_s=0.5)
    assert ctl.inspect(0.5, 0.0, 1, idle_for_s=1.0)


def test_defaults_are_the_reference_tuned_gains_and_a_500_ms_period() -> None:
    policy = ScaleDownPolicy()
    assert (policy.kp, policy.ki, policy.kd) == (0.433, 0.468, 0.480)
    assert policy.inspection_period_s == 0.5
    pid = ScaleDownController().pid  # what a handler declared scale_down=True gets
    assert (pid.kp, pid.ki, pid.kd) == (0.433, 0.468, 0.480)
    pooled = PoolOptions.from_keywords("h", {"stateless": True, "scale_down": True})
    assert pooled is not None and pooled.scale_down == policy
    unscaled = PoolOptions.from_keywords("h", {"stateless": True, "scale_down": False})
    assert unscaled is not None and unscaled.scale_down is None
