"""CPU and memory use of this worker, as fractions of the limit it actually runs under.

Inside a container (cgroup v2) the limits are the container's: ``cpu.max`` (quota /
period, else every host core) and ``memory.max`` (else host RAM); usage is
``cpu.stat usage_usec`` over wall time and the ``anon`` line of ``memory.stat``.
Outside one, psutil reads the host.

Why anonymous memory and not ``memory.current``: ``memory.current`` counts the page
cache, which the kernel fills with every file the process (or a neighbour in the same
cgroup) reads and writes and only gives back under pressure. A worker that logs or reads
files sees ``memory.current`` creep to the limit and stay there while nothing is at
risk; Temporal's resource-based supplier froze slot issuing for minutes on exactly this
and moved to anonymous memory. Anonymous memory (heap, stacks) is what an OOM kill is
actually about. On the host we use psutil's ``used`` (total - free - buffers - cache),
which excludes the page cache for the same reason.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class ResourceSample:
    cpu: float
    """Fraction of the CPU limit used since the previous sample, 0..1."""
    memory: float
    """Fraction of the memory limit held as anonymous memory, 0..1."""


class ResourceSampler(Protocol):
    """Anything that can tell current use; injectable so tests feed their own samples."""

    def sample(self) -> ResourceSample: ...


def _clamp(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x


class HostSampler:
    """The whole host, through psutil (CPU since the previous call, non-blocking)."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # primes the counter: the first call reads 0

    def sample(self) -> ResourceSample:
        mem = psutil.virtual_memory()
        return ResourceSample(
            cpu=_clamp(psutil.cpu_percent(interval=None) / 100),
            memory=_clamp(mem.used / mem.total),
        )


class CgroupV2Sampler:
    """This cgroup (v2): CPU against ``cpu.max``, anonymous memory against ``memory.max``."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self._last_usage_us = self._cpu_usage_us()
        self._last_at = time.monotonic()
        self.cpus = self._cpu_limit()
        self.memory_limit = self._memory_limit()

    @staticmethod
    def available(root: Path = CGROUP_ROOT) -> bool:
        return all((root / f).is_file() for f in ("cpu.stat", "memory.stat"))

    def _cpu_usage_us(self) -> int:
        for line in (self.root / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value)
        return 0

    def _cpu_limit(self) -> float:
        try:
            parts = (self.root / "cpu.max").read_text().split()
        except OSError:
            parts = []
        if not parts or parts[0] == "max":
            return float(os.cpu_count() or 1)
        return int(parts[0]) / int(parts[1] if len(parts) > 1 else 100_000)

    def _memory_limit(self) -> int:
        try:
            text = (self.root / "memory.max").read_text().strip()
        except OSError:
            text = "max"
        host = int(psutil.virtual_memory().total)
        return host if text == "max" else min(int(text), host)

    def _anon_bytes(self) -> int:
        for line in (self.root / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "anon":
                return int(value)
        return 0

    def sample(self) -> ResourceSample:
        now = time.monotonic()
        usage = self._cpu_usage_us()
        elapsed_us = (now - self._last_at) * 1e6
        cpu = (usage - self._last_usage_us) / (elapsed_us * self.cpus) if elapsed_us > 0 else 0.0
        self._last_usage_us, self._last_at = usage, now
        memory = self._anon_bytes() / self.memory_limit
        return ResourceSample(cpu=_clamp(cpu), memory=_clamp(memory))


def default_sampler() -> ResourceSampler:
    """The cgroup v2 sampler inside a container, the host one otherwise."""
    if CgroupV2Sampler.available():
        return CgroupV2Sampler()
    return HostSampler()
