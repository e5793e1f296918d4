"""Naming a process so that another process can later tell whether it still runs.

A Kafka dead-letter replay writes its process's name beside its claim (see
:mod:`conveyor.adapters.kafka.letters`): a later replay on the same machine can then
tell a stopped replay (taken over at once) from a slow one (waited for, however slow),
where a replay elsewhere can only go by the claim's age.

The name is ``MACHINE/PID/START``: the machine is the host name, the kernel's boot id and
the PID namespace, so that two containers with one host name, or a machine rebooted, are
not taken for the same; ``START`` is the process's start time in clock ticks, so that a
reused PID is not taken for the process that had it. Where ``/proc`` is missing (not
Linux), a process has no name (``""``) and every claim goes by its age.
"""

from __future__ import annotations

import os
import socket
from enum import Enum
from functools import cache
from pathlib import Path

PROC = Path("/proc")


class Seen(Enum):
    """What this process can tell of another, named by :func:`this_process`."""

    RUNNING = "running"
    GONE = "gone"
    ELSEWHERE = "elsewhere"
    """On another machine, in another PID namespace, or unnamed: unknown here."""


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None if none runs."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@cache
def _machine() -> str:
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return ""
    return f"{socket.gethostname()}|{boot}|{namespace}"


def name_of(pid: int) -> str:
    """The name of process ``pid`` of this machine (``""`` where it cannot have one, or
    no such process runs)."""
    machine, started = _machine(), _started(pid)
    if not machine or started is None:
        return ""
    return f"{machine}/{pid}/{started}"


def this_process() -> str:
    """This process's name (``""`` where it cannot have one)."""
    return name_of(os.getpid())


def seen(name: str) -> Seen:
    """Whether the process named ``name`` still runs, as far as this process can tell."""
    machine, _, rest = name.rpartition("/")  # MACHINE/PID/START: split from the right
    machine, _, pid = machine.rpartition("/")
    if not name or not _machine() or machine != _machine() or not (pid.isascii() and pid.isdigit()):
        return Seen.ELSEWHERE
    return Seen.RUNNING if _started(int(pid)) == rest else Seen.GONE
