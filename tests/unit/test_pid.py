"""The PID controller's arithmetic: P, I and D terms, anti-windup scaling, reset."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.platform.balancing.pid import PIDController


def test_proportional_only_is_gain_times_error() -> None:
    pid = PIDController(kp=2.0, ki=0.0, kd=0.0)
    assert pid.update(-3.0, 0.5) == pytest.approx(-6.0)
    assert pid.update(4.0, 0.5) == pytest.approx(8.0)


def test_integral_is_a_rectangle_sum_weighted_by_dt() -> None:
    pid = PIDController(kp=0.0, ki=1.0, kd=0.0)
    pid.update(1.0, 0.5)  # +0.5
    pid.update(2.0, 0.25)  # +0.5
    out = pid.update(-4.0, 1.0)  # -4.0
    assert pid.integral == pytest.approx(-3.0)
    assert out == pytest.approx(-3.0)


def test_derivative_is_backward_difference_starting_from_zero() -> None:
    pid = PIDController(kp=0.0, ki=0.0, kd=1.0)
    # previous error starts at 0, as in the reference loop: first derivative is e/dt
    assert pid.update(-2.0, 0.5) == pytest.approx(-4.0)
    assert pid.update(-2.0, 0.5) == pytest.approx(0.0)
    assert pid.update(1.0, 2.0) == pytest.approx(1.5)


@given(
    st.lists(
        st.tuples(
            st.floats(-100, 100, allow_nan=False),
            st.floats(0.01, 10, allow_nan=False),
        ),
        min_size=1,
        max_size=30,
    ),
    st.floats(0, 5),
    st.floats(0, 5),
    st.floats(0, 5),
)
def test_output_matches_closed_form(
    samples: list[tuple[float, float]], kp: float, ki: float, kd: float
) -> None:
    pid = PIDController(kp, ki, kd)
    out = 0.0
    for error, dt in samples:
        out = pid.update(error, dt)
    integral = math.fsum(e * dt for e, dt in samples)
    last_e, last_dt = samples[-1]
    prev_e = samples[-2][0] if len(samples) > 1 else 0.0
    expected = kp * last_e + ki * integral + kd * (last_e - prev_e) / last_dt
    assert out == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_scale_integral_shrinks_only_the_integral_term() -> None:
    pid = PIDController(kp=1.0, ki=1.0, kd=0.0)
    for _ in range(4):
        pid.update(-1.0, 1.0)
    assert pid.integral == pytest.approx(-4.0)
    pid.scale_integral(0.75)
    assert pid.integral == pytest.approx(-3.0)
    # next output: P = -1, I = -3 + -1
    assert pid.update(-1.0, 1.0) == pytest.approx(-5.0)
    pid.scale_integral(0.0)
    assert pid.integral == 0.0


def test_reset_forgets_integral_and_previous_error() -> None:
    pid = PIDController(kp=0.5, ki=0.5, kd=0.5)
    first = pid.update(-1.0, 1.0)
    pid.update(-7.0, 1.0)
    pid.reset()
    assert pid.integral == 0.0
    assert pid.update(-1.0, 1.0) == pytest.approx(first)


@pytest.mark.parametrize("dt", [0.0, -1.0, math.nan])
def test_non_positive_step_is_refused(dt: float) -> None:
    with pytest.raises(ValueError, match="dt_s"):
        PIDController(1, 1, 1).update(1.0, dt)


@pytest.mark.parametrize("factor", [-0.1, 1.5])
def test_scale_factor_outside_unit_interval_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="scale factor"):
        PIDController(1, 1, 1).scale_integral(factor)


def test_negative_gain_is_refused() -> None:
    with pytest.raises(ValueError, match="ki"):
        PIDController(1.0, -0.1, 0.0)
