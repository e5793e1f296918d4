"""A supervised child process on its own: it stops quietly when its supervisor is gone."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from conveyor.workers.supervisor.process import CHILD_MODULE
from conveyor.workers.supervisor.protocol import Alive, Ready, decode_event

REPO = Path(__file__).resolve().parents[2]


def test_a_child_whose_supervisor_is_gone_stops_quietly(tmp_path: Path) -> None:
    # The supervisor vanishes (its end of the event channel closes, its end of the
    # child's stdin too): the child drains and exits 0, and its last event, which
    # nobody can read, is dropped instead of ending in a BrokenPipeError traceback.
    read_fd, write_fd = os.pipe()
    err_path = tmp_path / "child.err"
    env = dict(os.environ, CONVEYOR_TEST_MESSAGES="0", PYTHONUNBUFFERED="1")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, "tests.apps.drain_app:app", "-",
             str(write_fd)],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=err, pass_fds=(write_fd,),
        )
    os.close(write_fd)
    try:
        readable, _, _ = select.select([read_fd], [], [], 30)
        assert readable, "the child sent nothing in 30s"
        with os.fdopen(read_fd, "rb", closefd=False) as events:
            # Beats (Alive) come from the start; the first other event is Ready.
            event = decode_event(events.readline())
            while isinstance(event, Alive):
                event = decode_event(events.readline())
            assert isinstance(event, Ready), event
        os.close(read_fd)  # the supervisor is gone ...
        read_fd = -1
        assert proc.stdin is not None
        proc.stdin.close()  # ... and so is the child's stdin: a stop
        assert proc.wait(timeout=30) == 0
    finally:
        if read_fd >= 0:
            os.close(read_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err_path.read_text(errors="replace")
    assert "the supervisor is gone" in stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
