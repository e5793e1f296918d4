"""Worker processes and config files for the Redis tests; the server itself
(``redis_server``, :class:`RedisServer`) is in tests/servers/redis.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor.workers.daemon as daemon_module
from conveyor import App, load_config
from conveyor.workers.daemon import WorkerDaemon
from tests.config_files import write_toml
from tests.servers import RedisServer as RedisServer  # re-exported for the tests here

REPO = Path(__file__).resolve().parents[3]


def status_json(path: Path, app: str | None = "rec") -> tuple[dict[str, object], str]:
    """``conveyor status --app rec --json`` on the config at ``path`` (``app`` None: no
    ``--app``, every app): the report and what it said on stderr (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "status", "--config", str(path), "--json",
         *(("--app", app) if app else ())], cwd=REPO, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def write_config(path: Path, url: str, **sections: dict[str, object]) -> Path:
    """A configs/redis.toml-like file pointing at ``url``, with overrides per section."""
    return write_toml(path, {
        "queues": {"adapter": "redis", "total": 8},
        "redis": {"url": url, "prefix": "t"},
        "balancer": {"kind": "dynamic", "membership": "redis"},
    }, **sections)


class Worker:
    """A ``conveyor worker`` subprocess running ``app`` (tests.apps.recorder by default)."""

    def __init__(self, name: str, config: Path, tmp: Path, *, work_ms: float = 0,
                 log_level: str = "info", record_starts: bool = False,
                 app: str = "tests.apps.recorder:app",
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.record = tmp / f"{name}.rec"
        self.starts = tmp / f"{name}.starts"
        """Handler starts, one line each (only with ``record_starts``)."""
        self.stderr_path = tmp / f"{name}.err"
        env = {**os.environ, "CONVEYOR_TEST_RECORD": str(self.record),
               "CONVEYOR_TEST_WORK_MS": str(work_ms), "PYTHONUNBUFFERED": "1",
               "CONVEYOR_TEST_STARTS": str(self.starts) if record_starts else "",
               **(env or {})}
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "--log-level", log_level, "worker",
             app, "--config", str(config)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=self._err,
        )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM (graceful drain) and wait for the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def rechecking_daemon(url: str, monkeypatch: pytest.MonkeyPatch) -> WorkerDaemon:
    """An in-process daemon of app ``rec`` on ``url`` (static balancer) that looks at the
    server's settings again every 0.05 s instead of every SERVER_RECHECK_S."""
    monkeypatch.setattr(daemon_module, "SERVER_RECHECK_S", 0.05)
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis"}, "redis": {"url": url},
        "balancer": {"kind": "static"}})
    return WorkerDaemon(App("rec"), config)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Every worker a test starts is appended here and killed at teardown."""
    started: list[Worker] = []
    try:
        yield started
    finally:
        for w in started:
            w.kill()


def read_records(paths: list[Path]) -> list[tuple[float, int, int, str, int, str]]:
    """Every line of the record files: (time, pid, queue, stream key, seq, message id)."""
    rows = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 6:
                continue  # a line cut short by SIGKILL
            t, pid, q, key, seq, mid = parts
            rows.append((float(t), int(pid), int(q), key, int(seq), mid))
    return rows


def wait_file_lines(paths: list[Path], n: int, timeout_s: float, what: str) -> None:
    def count() -> int:
        return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())

    deadline = time.monotonic() + timeout_s
    while count() < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} "
                                 f"({count()}/{n} lines)")
        time.sleep(0.05)
