"""conveyor.platform.processes: a process named by this_process() is seen running while
it runs and gone once it ended, and a name from another machine or a reused PID is not
taken for a process here."""

from __future__ import annotations

import subprocess
import sys

from conveyor.platform.processes import Seen, name_of, seen, this_process


def test_a_process_is_running_until_it_ends_then_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        name = name_of(child.pid)
        assert seen(name) is Seen.RUNNING
        assert seen(this_process()) is Seen.RUNNING
    finally:
        child.communicate(b"")
    assert child.returncode == 0
    assert seen(name) is Seen.GONE
    assert name_of(child.pid) == ""


def test_a_reused_pid_is_not_the_process_that_had_it() -> None:
    machine, pid, started = this_process().rsplit("/", 2)
    assert seen(f"{machine}/{pid}/{int(started) + 1}") is Seen.GONE


def test_names_from_elsewhere_or_none_are_unknown_here() -> None:
    machine, pid, started = this_process().rsplit("/", 2)
    host, boot, namespace = machine.split("|")
    other_boot = "0" * len(boot)
    assert seen(f"{host}|{other_boot}|{namespace}/{pid}/{started}") is Seen.ELSEWHERE
    assert seen(f"{host}-other|{boot}|{namespace}/{pid}/{started}") is Seen.ELSEWHERE
    assert seen(f"{host}|{boot}|pid:[1]/{pid}/{started}") is Seen.ELSEWHERE
    for garbage in ("", "nonsense", f"{machine}/x/1", "/1/2"):
        assert seen(garbage) is Seen.ELSEWHERE, garbage
