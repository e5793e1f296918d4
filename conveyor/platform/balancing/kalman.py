"""The cooperative dual-mode Kalman filter (CDM-KF) for resource statistics.

Placement wants a CPU or memory reading that *falls slowly* (a short stall must not
make a busy daemon look idle and attract a flood of work) but *rises fast* (new load
must be seen at once). One scalar Kalman filter cannot do both, so CDM-KF runs two and
lets them hand state to each other.

Each filter is the scalar Kalman filter with ``A = H = 1``, no control input, ``R = 1``
and the initial state ``x = 0, P = 1`` ("no prior knowledge, no trust")::

    predict:  P ← P + Q
    correct:  K ← P / (P + R);  x ← x + K·(z - x);  P ← (1 - K)·P

The *slow* filter has ``Q = 0`` (its gain shrinks towards 0: heavy inertia); the *fast*
filter has ``Q = 0.01`` (its gain settles near 0.095: quick, lightly damped). Both are
updated with every measurement, and the output comes from one of them:

* **fast regime** while the measurement is above the slow filter's new estimate;
* **slow regime** otherwise.

Hand-over (the "cooperative" part):

* slow → fast (the signal jumps above the slow estimate): the fast filter is set to
  ``(x = z, P = 0)`` — full trust in the measurement, so the output follows a jump at
  once instead of lagging — and then takes ``z`` as its measurement.
* fast → slow (the signal falls to or below the slow estimate): the slow filter is set
  to the fast filter's state, so the slow decay starts from where the fast filter
  left off (the latest peak), not from the average of the signal's whole lifetime
  that an independent ``Q = 0`` filter converges to; it then takes ``z``.

Decisions where the reference is vague (its prose and its published code disagree on
which filter gets ``(z, 0)``; we follow the code, because the prose's version — the
``Q = 0`` filter set to ``P = 0`` — would freeze the output forever):

* The filter being handed state is reset to the state *before* it consumed the current
  measurement and then consumes ``z`` once, so no measurement is counted twice (the
  published code runs the update again after overwriting, double-counting ``z``; the
  numerical difference is below the noise of any resource statistic).
* A tie (``z`` equal to the slow estimate) counts as "not rising": slow regime.
* Non-finite measurements are refused with ``InvalidArgumentError`` (a ``ValueError``)
  rather than poisoning state.

Cost: a fixed handful of float operations and six floats of state per update,
whatever the number of samples seen; nothing is allocated per update.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

from conveyor.platform.errors import InvalidArgumentError

SLOW_Q = 0.0
FAST_Q = 0.01
MEASUREMENT_R = 1.0


class Regime(enum.Enum):
    SLOW = "slow"
    FAST = "fast"


class ScalarKalmanFilter:
    """One scalar Kalman filter with ``A = H = 1``, ``R = 1`` and process noise ``q``."""

    __slots__ = ("error", "estimate", "q")

    def __init__(self, q: float, estimate: float = 0.0, error: float = 1.0) -> None:
        self.q = q
        self.estimate = estimate
        self.error = error

    def update(self, measurement: float) -> float:
        p = self.error + self.q
        gain = p / (p + MEASUREMENT_R)
        self.estimate += gain * (measurement - self.estimate)
        self.error = (1.0 - gain) * p
        return self.estimate


class CDMKalmanFilter:
    """Cooperative dual-mode Kalman filter: slow to fall, quick to rise. See module doc."""

    __slots__ = ("_fast_p", "_fast_regime", "_fast_x", "_slow_p", "_slow_x", "_value")

    def __init__(self) -> None:
        self._slow_x = 0.0
        self._slow_p = 1.0
        self._fast_x = 0.0
        self._fast_p = 1.0
        self._fast_regime = False
        self._value = 0.0

    @property
    def value(self) -> float:
        """The latest filtered output (0.0 before the first measurement)."""
        return self._value

    @property
    def regime(self) -> Regime:
        return Regime.FAST if self._fast_regime else Regime.SLOW

    def update(self, measurement: float) -> float:
        """Consume one measurement and return the filtered value."""
        z = float(measurement)
        if not math.isfinite(z):
            raise InvalidArgumentError(f"measurement must be finite, got {measurement!r}")
        # the two scalar filters are inlined: this is the hot path of placement
        fast_x0 = self._fast_x
        fast_p0 = self._fast_p
        p = self._slow_p  # + SLOW_Q (= 0)
        k = p / (p + MEASUREMENT_R)
        slow_x = self._slow_x + k * (z - self._slow_x)
        slow_p = (1.0 - k) * p

        if z > slow_x:
            if not self._fast_regime:
                self._fast_regime = True
                fast_x0 = z
                fast_p0 = 0.0
            p = fast_p0 + FAST_Q
            k = p / (p + MEASUREMENT_R)
            self._fast_x = fast_x0 + k * (z - fast_x0)
            self._fast_p = (1.0 - k) * p
            self._slow_x = slow_x
            self._slow_p = slow_p
            self._value = self._fast_x
            return self._value

        p = fast_p0 + FAST_Q
        k = p / (p + MEASUREMENT_R)
        fast_x = fast_x0 + k * (z - fast_x0)
        fast_p = (1.0 - k) * p
        if self._fast_regime:
            self._fast_regime = False
            # slow restarts from where the fast filter stood before this sample
            p = fast_p0  # + SLOW_Q
            k = p / (p + MEASUREMENT_R)
            slow_x = fast_x0 + k * (z - fast_x0)
            slow_p = (1.0 - k) * p
        self._fast_x = fast_x
        self._fast_p = fast_p
        self._slow_x = slow_x
        self._slow_p = slow_p
        self._value = slow_x
        return slow_x

    def reset(self) -> None:
        """Back to "no prior knowledge" (``x = 0, P = 1`` for both filters)."""
        self._slow_x = self._fast_x = self._value = 0.0
        self._slow_p = self._fast_p = 1.0
        self._fast_regime = False


def cdm_filter(samples: Iterable[float]) -> list[float]:
    """Run a fresh CDM-KF over ``samples`` and return every output (for plots, tests)."""
    flt = CDMKalmanFilter()
    return [flt.update(z) for z in samples]


def single_filter(samples: Iterable[float], q: float) -> list[float]:
    """Run a fresh single-mode filter with process noise ``q`` over ``samples``."""
    flt = ScalarKalmanFilter(q)
    return [flt.update(z) for z in samples]
