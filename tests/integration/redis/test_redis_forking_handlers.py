"""A handler that copies its worker with a bare ``os.fork()`` and whose copy does not end
itself with ``os._exit()``: it returns from the handler (or awaits the event loop, or
raises) into the worker, on ``conveyor worker`` with the shipped Redis config, in one
process or under ``--processes 2:2`` (tests/apps/fork_app.py is the app).

The copy must never go on as a worker: it exits at once, with status 70, and one line
on stderr — no acknowledgement, no pull, no handler call of its own. It went on running
the worker's event loop on its parent's connections instead, as an orphan once the
worker stopped (one was found running 1 h 47 min later).

Exactly what was published is handled, each message once, by the worker itself;
duplicates allowed: none — no process of the worker dies and the copies touch nothing,
so nothing is delivered twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor.client import Publish, SyncClient
from conveyor.platform.config import load_config
from conveyor.platform.forks import COPY_STATUS
from tests.conftest import reaped, wait_until_sync
from tests.integration.redis.conftest import REPO, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

N, STREAMS, EVERY = 60, 6, 10
COPY_ENDS_S = 5.0
"""How long a copy may take to end once it was forked (it ends as soon as its handler
call returns: milliseconds; the rest is a loaded machine's slack)."""


def ended(pid: int) -> tuple[bool, int | None]:
    """Whether process ``pid`` (not this one's child) has ended, and its wait status if
    it is a zombie its parent has not reaped yet (``/proc``'s ``exit_code``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True, None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] != "Z":
        return False, None
    return True, int(fields[-1]) if len(fields) >= 50 else None


@pytest.mark.parametrize(("app", "how", "processes"), [
    ("app", "returns", None), ("app", "awaits", None), ("app", "raises", None),
    ("sync_app", "returns", None), ("app", "returns", "2:2")])
def test_a_handlers_forked_copy_of_the_worker_ends_at_once_and_touches_nothing(
    redis_server: RedisServer, tmp_path: Path, app: str, how: str, processes: str | None,
) -> None:
    shipped = REPO / "configs" / "redis.toml"
    record = tmp_path / "handled.rec"
    forks = tmp_path / "handled.rec.forks"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CONVEYOR_REDIS__URL": redis_server.url,
           "CONVEYOR_TEST_RECORD": str(record), "CONVEYOR_TEST_FORK_EVERY": str(EVERY),
           "CONVEYOR_TEST_FORK_HOW": how}
    config = load_config(shipped, environ=env)
    err_path = tmp_path / "worker.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", f"tests.apps.fork_app:{app}",
             "--config", str(shipped), *(("--processes", processes) if processes else ())],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)

    def rows() -> list[list[str]]:
        text = record.read_text() if record.exists() else ""
        return [line.split() for line in text.splitlines()]

    def copies() -> list[int]:
        return [int(pid) for pid in forks.read_text().split()] if forks.exists() else []

    statuses: dict[int, int | None] = {}
    try:
        with reaped(proc):
            with SyncClient.from_config(config) as client:
                client.publish_batch(Publish("items", f"s{i % STREAMS}",
                                             {"seq": i, "text": f"m{i}"}) for i in range(N))
            wait_until_sync(lambda: len(rows()) >= N and len(copies()) == N // EVERY, 60,
                            "every message handled and every fork recorded")
            deadline = time.monotonic() + COPY_ENDS_S
            for pid in copies():  # each was forked before its message was handled
                while not (done := ended(pid))[0]:
                    assert time.monotonic() < deadline, (
                        f"the forked copy {pid} of the worker still runs "
                        f"{COPY_ENDS_S:g}s after every message was handled\n"
                        + err_path.read_text()[-3000:])
                    time.sleep(0.02)
                statuses[pid] = done[1]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, err_path.read_text()[-3000:]
    finally:
        for pid in copies():  # (without the fix, running on as workers)
            with contextlib.suppress(ProcessLookupError):
                if not ended(pid)[0]:
                    os.kill(pid, signal.SIGKILL)
    log = err_path.read_text()
    handled = rows()
    # Written by the worker (or its --processes children), never by a copy.
    assert not {int(r[0]) for r in handled} & set(copies()), "a copy handled messages"
    if processes is None:
        assert {int(r[0]) for r in handled} == {proc.pid}
    assert Counter((int(r[1]), r[2]) for r in handled) == Counter(
        (i, f"m{i}") for i in range(N)), "each published message handled once"
    assert {r[3] for r in handled} == {"1"}, "a message delivered again"
    # Each ended with exit(70): its wait status, read while the worker had not reaped it.
    assert statuses == dict.fromkeys(copies(), COPY_STATUS << 8), statuses
    assert log.count("forked from worker process") == N // EVERY, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
