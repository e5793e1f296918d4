"""Synthetic CPU-usage signals for the CDM-KF demonstration (2,500 samples, in %).

``drop``  steady ~60 % with small noise; at 60 % of the run it falls to 10 % for 3 %
          of the run (a stall), then returns — the reference's first example
``rise``  ~20 %, then a jump to ~80 % at 40 % of the run
``wave``  50 ± 40 % sine, period 250 samples, small noise
``noise`` 50 % with large Gaussian noise (sd 15), clipped to [0, 100]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.platform.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SIGNALS = ("drop", "rise", "wave", "noise")
SAMPLES = 2500


def make_signal(name: str, seed: int = 0, samples: int = SAMPLES) -> npt.NDArray[np.float64]:
    import numpy as np

    if name not in SIGNALS:
        raise InvalidArgumentError(f"unknown signal {name!r}; choose one of {', '.join(SIGNALS)}")
    rng = np.random.default_rng([seed, SIGNALS.index(name)])
    n = np.arange(samples)
    if name == "drop":
        sig = 60.0 + rng.normal(0.0, 2.0, samples)
        start, width = int(0.6 * samples), max(1, int(0.03 * samples))
        sig[start : start + width] = 10.0 + rng.normal(0.0, 1.0, width)
    elif name == "rise":
        sig = np.where(n < int(0.4 * samples), 20.0, 80.0) + rng.normal(0.0, 2.0, samples)
    elif name == "wave":
        sig = 50.0 + 40.0 * np.sin(2 * np.pi * n / 250.0) + rng.normal(0.0, 2.0, samples)
    else:
        sig = 50.0 + rng.normal(0.0, 15.0, samples)
    return np.clip(sig, 0.0, 100.0)
