"""A handler that ends its worker process another way than ``os._exit``, under
``conveyor worker --processes 2:2`` on the shipped Redis config: ``KeyboardInterrupt``
or ``SystemExit`` raised while a thread the app started (not a daemon thread) runs, a
segfault, or ``os._exit`` after forking a process that outlives the crash. Each crash
costs one delivery, as a plain ``os._exit``'s does
(tests/integration/any_broker/test_a_message_that_kills_its_worker.py): after
``max_deliveries`` starts the poison is a ``DeliveryLimit`` letter and every other
message is handled (tests/integration/poison.py asserts it; duplicates allowed: what a
dying process had finished but not yet acknowledged, never more than 3 runs).

And each crash reads as one: the child's one ERROR line, then the supervisor's line
naming how the process ended — no traceback (a ``KeyboardInterrupt`` printed its 40
lines per crash), and no child left hanging at exit behind the app's thread until the
supervisor killed it for its silence (10 s per crash), and no process forked by the
handler holding the supervisor's event channel open: the supervisor took the child for
alive until the fork exited (a minute here), and its queues waited as long.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from tests.integration.poison import run_poison_under_supervisor
from tests.integration.redis.conftest import REPO, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ENDED = {"KeyboardInterrupt": "exit status 130", "SystemExit": "exit status 3",
         "segfault": "killed by SIGSEGV", "fork": "exit status 1"}


@pytest.mark.parametrize("exit_how", list(ENDED))
def test_a_handler_that_ends_its_process_is_dead_lettered_and_each_crash_is_one_line(
    redis_server: RedisServer, tmp_path: Path, exit_how: str,
) -> None:
    env = {"CONVEYOR_REDIS__URL": redis_server.url,
           "CONVEYOR_BALANCER__LEASE_TTL_S": "2"}  # each crash waits out the lease
    try:
        print("\n" + run_poison_under_supervisor(REPO / "configs" / "redis.toml", env,
                                                 tmp_path, 3, exit_how))
    finally:
        forks = tmp_path / "handled.rec.forks"
        for pid in forks.read_text().split() if forks.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    log = (tmp_path / "supervisor.err").read_text()
    assert "Traceback" not in log, log[-4000:]
    assert "has sent nothing" not in log, log[-4000:]  # no child hung at exit
    died = re.findall(r"supervisor: process #\d+ died \((.*?)\)", log)
    assert died == [ENDED[exit_how]] * 3, log[-4000:]
