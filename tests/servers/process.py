"""What every server kind shares, written once: a process started on free ports, a wait
(with a deadline) until it answers, its stop, and the one fixture factory.

A server kind is a class with ``start()`` (spawn its processes and return once they
answer) and ``stop()`` (idempotent); :func:`server_fixture` turns a function that builds
one into a pytest fixture. A missing binary skips locally and fails under
``CONVEYOR_REQUIRE_SERVERS=1`` (:func:`require`, the server policy of tests/conftest.py).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Literal, Protocol, TypeVar

import pytest

from tests.conftest import free_port, server_missing, wait_until_sync


class Server(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Server)


def require(what: str, *binaries: str) -> None:
    """Skip (locally) or fail (CI) unless every one of ``binaries`` is on PATH."""
    if any(shutil.which(binary) is None for binary in binaries):
        server_missing(what)


def started(server: S) -> S:
    """``server``, started; whatever it started is stopped if starting fails."""
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server


def server_fixture(name: str, build: Callable[[Path], S], *,
                   scope: Literal["function", "module", "session"] = "function",
                   doc: str = "") -> Callable[..., Iterator[S]]:
    """A fixture ``name`` yielding ``started(build(a fresh directory))``, stopped after.

    ``build`` checks its binaries (:func:`require`) and returns the server unstarted.
    Scope ``module`` (or ``session``): shared by the tests, which isolate themselves
    (key prefixes, topic names); ``function``: a test's own, which it may kill parts of.
    """

    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S]:
        server = started(build(tmp_path_factory.mktemp(name)))
        try:
            yield server
        finally:
            server.stop()

    fixture.__doc__ = doc
    fixture.__name__ = name
    return pytest.fixture(scope=scope, name=name)(fixture)


def distinct_free_ports(count: int) -> list[int]:
    """``count`` ports from free_port(), which never hands out one port twice."""
    return [free_port() for _ in range(count)]


class Process:
    """One server process: its command line, its log file, the running ``Popen``."""

    def __init__(self, args: Sequence[str], log_path: Path, *, cwd: str | None = None,
                 output_to_log: bool = False) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.cwd = cwd
        self.output_to_log = output_to_log
        """Send stdout and stderr to ``log_path`` (servers without a log file option)."""
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.output_to_log:
            out = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=self.cwd)
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGKILL, timeout_s: float = 10.0) -> None:
        """Send ``sig`` (SIGTERM: let it flush) and wait; SIGKILL if it outlives
        ``timeout_s``. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log_tail(self, chars: int = 1500) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-chars:]


def wait_answering(answers: Callable[[], bool], timeout_s: float, what: str, *,
                   processes: Sequence[Process], errors: tuple[type[Exception], ...] = (),
                   logs: Sequence[Process] | None = None) -> None:
    """Wait until ``answers()``, ``errors`` meaning "not yet"; fail at the deadline, or
    as soon as one of ``processes`` (those meant to be running) has exited, with the
    log tails of ``logs`` (default: ``processes``)."""

    def check() -> bool:
        exited = [p for p in processes if not p.alive()]
        if exited:
            raise AssertionError(f"{exited[0].args[0]} exited while waiting for {what}")
        try:
            return answers()
        except errors:
            return False

    try:
        wait_until_sync(check, timeout_s, what)
    except AssertionError as exc:
        tails = "\n".join(f"-- {p.log_path.parent.name}/{p.log_path.name} "
                          f"(alive: {p.alive()}):\n{p.log_tail()}"
                          for p in (processes if logs is None else logs))
        raise AssertionError(f"{exc}\n{tails}") from None
