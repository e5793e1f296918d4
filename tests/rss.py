"""A process's peak resident memory, as the kernel keeps it (Linux)."""

from __future__ import annotations

from pathlib import Path


def peak_rss_mb(pid: int) -> float:
    """``VmHWM`` of ``pid``: its resident set's high-water mark, which no sampling can
    miss, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")
