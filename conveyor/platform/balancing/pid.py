"""A discrete PID controller, pure and clock-free.

``update(error, dt_s)`` returns ``kp·e + ki·∫e dt + kd·de/dt`` where the integral is a
rectangle sum (``integral += e·dt``) and the derivative a backward difference
(``(e - e_prev) / dt``). The caller owns time: it passes the step, so the same object
can be driven by a simulation or by a real loop whose ticks jitter.

The previous error starts at ``0.0``, not at the first error, exactly as in the
reference scale-down loop (``previousError = 0``): the first update therefore carries a
derivative term of ``e/dt``. For the scale-down controller, whose error is never
positive, that first kick can only push towards "shrink", which the dead zone absorbs.
"""

from __future__ import annotations

import math

from conveyor.platform.errors import InvalidArgumentError


class PIDController:
    """Proportional-integral-derivative controller with explicit time steps.

    Not thread-safe; cheap (a handful of float operations per update, constant state).
    """

    __slots__ = ("_integral", "_last_output", "_previous_error", "kd", "ki", "kp")

    def __init__(self, kp: float, ki: float, kd: float) -> None:
        for name, gain in (("kp", kp), ("ki", ki), ("kd", kd)):
            if not math.isfinite(gain) or gain < 0:
                raise InvalidArgumentError(
                    f"PID gain {name} must be a finite number >= 0, got {gain!r}"
                )
        self.kp = kp
        self.ki = ki
        self.kd = kd
        self._integral = 0.0
        self._previous_error = 0.0
        self._last_output = 0.0

    @property
    def integral(self) -> float:
        """The accumulated ``∫e dt`` (before multiplication by ``ki``)."""
        return self._integral

    @property
    def last_output(self) -> float:
        return self._last_output

    def update(self, error: float, dt_s: float) -> float:
        """Feed one error sample taken ``dt_s`` after the previous one; return the signal."""
        if not dt_s > 0:
            raise InvalidArgumentError(f"dt_s must be > 0, got {dt_s!r}")
        self._integral += error * dt_s
        derivative = (error - self._previous_error) / dt_s
        self._previous_error = error
        self._last_output = self.kp * error + self.ki * self._integral + self.kd * derivative
        return self._last_output

    def scale_integral(self, factor: float) -> None:
        """Anti-windup: multiply the accumulated integral by ``factor`` (0 ≤ factor ≤ 1).

        Used when the actuator has acted (a worker was removed) so that error accumulated
        *before* the action does not keep driving further actions after it.
        """
        if not 0.0 <= factor <= 1.0:
            raise InvalidArgumentError(
                f"integral scale factor must be within [0, 1], got {factor!r}"
            )
        self._integral *= factor

    def reset(self) -> None:
        """Forget all history, as if freshly constructed (gains are kept)."""
        self._integral = 0.0
        self._previous_error = 0.0
        self._last_output = 0.0
