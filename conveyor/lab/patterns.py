"""Message-arrival patterns for the stateless-worker simulation.

Every generator returns a sorted ``float64`` array of arrival times in ``[0, duration_s)``
and draws all its randomness from the ``numpy.random.Generator`` it is given, so a
seed reproduces a pattern exactly. The seven shapes follow the reference (its
simulation project), with the reference parameters as defaults: base rate 100 msg/s,
60 s.

========  ======================================================================
constant  one message every ``1/rate`` s
periodic  rate x (1 + U - 0.5) between arrivals, x0.1 inside (T/4, T/2) and
          (3T/4, T)
ramp      rate rises linearly from 0 to ``rate`` at T/2, then falls back to 0
spike     every 10 s, ``rate x 0.05`` (= 5) messages uniformly within 0.05 s
burst     from t = 0: 1 s at 5 x rate, then the rate decays by x0.9 per message
          down to the base rate 0.1 x rate (= 10 msg/s); quiet for U(5, 15) s;
          repeat
chaotic   base rate 0.1 x rate; before each base arrival, with probability 0.1 a
          burst instead: ``rate x U(0, 2)`` msg/s uniformly over the burst
          window, whose length starts at 1 s and grows by half after each burst
poisson   exponential gaps with λ = rate
========  ======================================================================

Decision for *chaotic*: the reference's code draws the burst rate ``rate x U(0, 2)``
but then always emits a fixed 20 messages per burst; its prose says bursts have "a
higher, yet randomly determined rate", so we use the drawn rate (messages in a burst
= rate x window length).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.platform.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Times = npt.NDArray[np.float64]
    Generate = Callable[[np.random.Generator, float, float], Times]

PATTERNS = ("constant", "periodic", "ramp", "spike", "burst", "chaotic", "poisson")
TRAINING_PATTERNS = PATTERNS[:-1]
"""Tuning uses these six; Poisson is held out to test the tuned gains on unseen load."""


def _finish(times: list[float] | Times, duration_s: float) -> Times:
    import numpy as np

    arr = np.asarray(times, dtype=np.float64)
    arr = arr[(arr >= 0.0) & (arr < duration_s)]
    arr.sort()
    return arr


def constant(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    import numpy as np

    return _finish(np.arange(1, math.ceil(rate * duration_s) + 1) / rate, duration_s)


def periodic(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    quiet = ((duration_s / 4, duration_s / 2), (3 * duration_s / 4, duration_s))
    out: list[float] = []
    t = 0.0
    while t < duration_s:
        factor = 0.1 if any(a < t < b for a, b in quiet) else 1.0
        t += 1.0 / (rate * factor * (1.0 + rng.random() - 0.5))
        out.append(t)
    return _finish(out, duration_s)


def ramp(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    half = duration_s / 2
    out: list[float] = []
    t = 0.0
    while t < duration_s:
        current = rate * t / half if t < half else rate * (1.0 - (t - half) / half)
        if current <= 0:
            t += 1.0
            continue
        t += 1.0 / current
        out.append(t)
    return _finish(out, duration_s)


def spike(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    import numpy as np

    interval_s, width_s = 10.0, 0.05
    count = int(rate * width_s)
    starts = np.arange(interval_s, duration_s, interval_s)
    times = (starts[:, None] + rng.random((len(starts), count)) * width_s).ravel()
    return _finish(times, duration_s)


def burst(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    base, peak, decay = 0.1 * rate, 5.0 * rate, 0.9
    out: list[float] = []
    t = 0.0
    while t < duration_s:
        spike_end = t + 1.0
        while t < spike_end and t < duration_s:
            t += 1.0 / peak
            out.append(t)
        current = peak
        while current > base and t < duration_s:
            current *= decay
            t += 1.0 / current
            out.append(t)
        t += rng.uniform(5.0, 15.0)
    return _finish(out, duration_s)


def chaotic(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    base, burst_p = 0.1 * rate, 0.1
    window_s = 1.0
    out: list[float] = []
    t = 0.0
    while t < duration_s:
        if rng.random() < burst_p:
            count = int(rate * rng.random() * 2.0 * window_s)
            out.extend((t + rng.random(count) * window_s).tolist())
            t += window_s
            window_s *= 1.5
        else:
            t += 1.0 / base
            out.append(t)
    return _finish(out, duration_s)


def poisson(rng: np.random.Generator, rate: float, duration_s: float) -> Times:
    import numpy as np

    chunks: list[Times] = []
    t = 0.0
    while t < duration_s:
        gaps = rng.exponential(1.0 / rate, max(16, int(rate * duration_s * 1.2)))
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    return _finish(np.concatenate(chunks), duration_s)


GENERATORS: dict[str, Generate] = {
    "constant": constant,
    "periodic": periodic,
    "ramp": ramp,
    "spike": spike,
    "burst": burst,
    "chaotic": chaotic,
    "poisson": poisson,
}


def generate(name: str, seed: int, rate: float = 100.0, duration_s: float = 60.0) -> Times:
    """Arrival times of pattern ``name``; the same seed always gives the same array."""
    import numpy as np

    try:
        gen = GENERATORS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown pattern {name!r}; choose one of {', '.join(PATTERNS)}"
        ) from None
    # each pattern gets its own stream so adding a pattern never changes the others
    rng = np.random.default_rng([seed, PATTERNS.index(name)])
    return gen(rng, rate, duration_s)


class ArrivalsFileError(InvalidArgumentError):
    """The replay file is not one non-negative float (seconds) per line."""


MAX_ARRIVAL_S = 86_400.0
"""The latest arrival time a replay takes, a day: the run is simulated in steps of
:attr:`~conveyor.lab.sim.SimConfig.step_s` (a day takes about a minute), and a later
time was an array of its steps too large to allocate."""

_LINE_MAX = 1000
"""The longest line of an arrivals file read: a number is far shorter, and a file with
no newline (``/dev/zero``) would be read whole as one line."""


def load_arrivals(path: Path) -> Times:
    """Read a replay file: one arrival time in seconds per line; blank lines and ``#``
    comments are ignored. Times are sorted; the run covers them all."""
    import numpy as np

    values: list[float] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(_LINE_MAX + 1), ""), 1):
            if len(raw) > _LINE_MAX:
                raise ArrivalsFileError(
                    f"{path}:{lineno}: a line of more than {_LINE_MAX} characters is no "
                    "number of seconds")
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                value = float(line)
            except ValueError:
                raise ArrivalsFileError(
                    f"{path}:{lineno}: {line!r} is not a number of seconds"
                ) from None
            if not math.isfinite(value) or value < 0:
                raise ArrivalsFileError(
                    f"{path}:{lineno}: an arrival time is a finite number of seconds >= 0, "
                    f"got {line}")
            if value > MAX_ARRIVAL_S:
                raise ArrivalsFileError(
                    f"{path}:{lineno}: an arrival time is at most {MAX_ARRIVAL_S:.0f} "
                    f"seconds (a day), got {line}")
            values.append(value)
    if not values:
        raise ArrivalsFileError(f"{path}: no arrival times")
    arr = np.asarray(values, dtype=np.float64)
    arr.sort()
    return arr
