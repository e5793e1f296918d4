"""CPU and memory use of this worker, as fractions of the limit it actually runs under.

Under cgroup v2 the sampler reads this process's own cgroup — the ``0::`` line of
``/proc/self/cgroup`` under ``/sys/fs/cgroup``, which is the mount's root inside a
container with its own cgroup namespace and e.g. ``system.slice/app.service`` for a
systemd unit on a host — and the limits are the tightest on the way from it up to the
root: ``cpu.max`` (quota / period, else every host core) and ``memory.max`` (else host
RAM), since a limit set on a parent binds its children too. Usage is ``cpu.stat
usage_usec`` over wall time and the ``anon`` line of ``memory.stat``. Without cgroup
v2, psutil reads the host.

Why anonymous memory and not ``memory.current``: ``memory.current`` counts the page
cache, which the kernel fills with every file the process (or a neighbour in the same
cgroup) reads and writes and only gives back under pressure. A worker that logs or reads
files sees ``memory.current`` creep to the limit and stay there while nothing is at
risk; Temporal's resource-based supplier froze slot issuing for minutes on exactly this
and moved to anonymous memory. Anonymous memory (heap, stacks) is what an OOM kill is
actually about. On the host we use psutil's ``used`` (total - free - buffers - cache),
which excludes the page cache for the same reason.

Placement (:class:`PlacementResources`) reads the same samplers, in bytes as well as
fractions: *used* is the same anonymous memory (host: psutil's ``used``) and
*available* is what could still be taken before the limit — the limit minus the
working set (``memory.current`` less ``inactive_file``, the kubelet's definition:
active page cache is counted, reclaimable cache is not), never more than the host has
available (host: psutil's ``available``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from conveyor.platform.balancing.placement import ResourcePlacer

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def own_cgroup(mount: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> Path:
    """This process's cgroup v2 directory under ``mount``; ``mount`` itself when
    ``proc_cgroup`` has no v2 (``0::``) line or names a directory not visible here."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return mount
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            candidate = mount / path.strip().lstrip("/")
            return candidate if candidate.is_dir() else mount
    return mount


@dataclass(frozen=True, slots=True)
class ResourceSample:
    cpu: float
    """Fraction of the CPU limit used since the previous sample, 0..1."""
    memory: float
    """Fraction of the memory limit held as anonymous memory, 0..1."""
    memory_used_bytes: float = 0.0
    """The anonymous memory (host: psutil's ``used``) ``memory`` is the fraction of."""
    memory_limit_bytes: float = 0.0
    """The limit: the tightest ``memory.max``, else host RAM; 0 when a sampler does not
    say (placement then scores on CPU alone)."""
    memory_available_bytes: float = 0.0
    """What could still be taken before the limit (see the module's docstring)."""


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
            memory_used_bytes=float(mem.used),
            memory_limit_bytes=float(mem.total),
            memory_available_bytes=float(mem.available),
        )


class CgroupV2Sampler:
    """A cgroup (v2): CPU against ``cpu.max``, anonymous memory against ``memory.max``.

    ``root`` is the cgroup read (by default this process's own, see :func:`own_cgroup`);
    limits are the tightest of ``root`` and its parents up to ``mount``.
    """

    def __init__(self, root: Path | None = None, mount: Path = CGROUP_ROOT) -> None:
        self.root = own_cgroup(mount) if root is None else root
        self.mount = mount
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

    def _lineage(self) -> list[Path]:
        """``root`` and its parents up to ``mount`` (just ``root`` if outside it)."""
        dirs = [self.root]
        if self.mount in self.root.parents:
            for parent in self.root.parents:
                dirs.append(parent)
                if parent == self.mount:
                    break
        return dirs

    def _limits(self, name: str) -> list[list[str]]:
        """The set (not ``max``) values of file ``name`` along the lineage, split."""
        found = []
        for d in self._lineage():
            try:
                parts = (d / name).read_text().split()
            except OSError:
                continue
            if parts and parts[0] != "max":
                found.append(parts)
        return found

    def _cpu_limit(self) -> float:
        quotas = [int(p[0]) / int(p[1] if len(p) > 1 else 100_000)
                  for p in self._limits("cpu.max")]
        return min([float(os.cpu_count() or 1), *quotas])

    def _memory_limit(self) -> int:
        host = int(psutil.virtual_memory().total)
        return min([host, *(int(p[0]) for p in self._limits("memory.max"))])

    def _memory_stat(self) -> dict[str, int]:
        """The ``anon`` and ``inactive_file`` lines of ``memory.stat`` (0 when absent)."""
        found = {"anon": 0, "inactive_file": 0}
        for line in (self.root / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in found:
                found[name] = int(value)
        return found

    def _available_bytes(self, inactive_file: int) -> int:
        """The limit less the working set, at most what the host has available; the
        host's figure alone where there is no ``memory.current`` (the root cgroup)."""
        host = int(psutil.virtual_memory().available)
        try:
            current = int((self.root / "memory.current").read_text())
        except (OSError, ValueError):
            return host
        return max(0, min(self.memory_limit - (current - inactive_file), host))

    def sample(self) -> ResourceSample:
        now = time.monotonic()
        usage = self._cpu_usage_us()
        elapsed_us = (now - self._last_at) * 1e6
        cpu = (usage - self._last_usage_us) / (elapsed_us * self.cpus) if elapsed_us > 0 else 0.0
        self._last_usage_us, self._last_at = usage, now
        stat = self._memory_stat()
        return ResourceSample(
            cpu=_clamp(cpu),
            memory=_clamp(stat["anon"] / self.memory_limit),
            memory_used_bytes=float(stat["anon"]),
            memory_limit_bytes=float(self.memory_limit),
            memory_available_bytes=float(self._available_bytes(stat["inactive_file"])),
        )


def default_sampler() -> ResourceSampler:
    """The cgroup v2 sampler of this process's cgroup if there is one, else the host's."""
    root = own_cgroup()
    if CgroupV2Sampler.available(root):
        return CgroupV2Sampler(root)
    return HostSampler()


def placement_stats(sample: ResourceSample) -> dict[str, float]:
    """``sample`` in the units of :mod:`conveyor.platform.balancing.placement`'s ``STAT_KEYS``.

    CPU is a percent of this worker's CPU limit, memory is in bytes against its memory
    limit: a container at its quota looks busy however idle the host around it is.
    """
    return {
        "cpu_percent": sample.cpu * 100,
        "memory_used_bytes": sample.memory_used_bytes,
        "memory_available_bytes": sample.memory_available_bytes,
        "memory_total_bytes": sample.memory_limit_bytes,
    }


class PlacementResources:
    """What a daemon publishes for resource placement: its sampler's CPU and memory
    (:func:`placement_stats`), CDM-KF-filtered here.

    Filtering at the source means every daemon scores from the same published numbers.
    ``sampler`` defaults to :func:`default_sampler`; give each caller its own, since a
    sampler's CPU is the use since *its* previous sample.
    """

    def __init__(self, member_id: str, sampler: ResourceSampler | None = None) -> None:
        self._sampler = sampler if sampler is not None else default_sampler()
        self._placer = ResourcePlacer()
        self._member_id = member_id

    def sample(self) -> dict[str, float]:
        raw = placement_stats(self._sampler.sample())
        return dict(self._placer.observe(self._member_id, raw))
