"""``conveyor worker --processes`` on the shipped config, on each broker: a child that is
alive to the OS but silent to its supervisor (SIGSTOP, or hung holding the interpreter)
is killed and replaced, so its queues do not wait for it; a child whose handler merely
blocks its event loop is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conveyor import Publish, load_config
from conveyor.client import SyncClient
from tests.conftest import wait_until_sync
from tests.integration.any_broker.conftest import Broker
from tests.integration.redis.conftest import REPO, read_records

pytestmark = pytest.mark.slow

SILENT_CHILD_S = 2.0
CACHE = 64
QUICK = {"CONVEYOR_SUPERVISOR__SILENT_CHILD_S": str(SILENT_CHILD_S),
         "CONVEYOR_WORKER__CACHE_CAPACITY": str(CACHE)}
"""The shipped config but for these: a cache of 64 keeps the bound on duplicates tight
(the shipped 1,024 a queue would allow most of the run)."""


class Supervised:
    """A ``conveyor worker --processes`` subprocess and its children."""

    def __init__(self, tmp_path: Path, broker: Broker, processes: str, app: str,
                 env: dict[str, str]) -> None:
        self.err_path = tmp_path / "supervisor.err"
        self.broker_config = broker.shipped
        self.env = {**broker.env, **QUICK, **env}
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "conveyor.cli", "worker", app,
                 "--config", str(broker.shipped), "--processes", processes],
                cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                stdout=subprocess.DEVNULL, stderr=err,
            )

    def client(self) -> SyncClient:
        return SyncClient.from_config(load_config(self.broker_config, environ=self.env))

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def live_children(self) -> list[psutil.Process]:
        return [c for c in psutil.Process(self.proc.pid).children()
                if c.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED)]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            for child in psutil.Process(self.proc.pid).children():
                child.kill()
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def supervised() -> Iterator[list[Supervised]]:
    started: list[Supervised] = []
    yield started
    for s in started:
        s.kill()


def test_a_stopped_child_is_killed_and_its_queues_handled_by_the_others_without_loss(
    broker: Broker, tmp_path: Path, supervised: list[Supervised]
) -> None:
    # Without the beat, a SIGSTOPped child kept its queues for as long as it was stopped:
    # its leases lapsed (Redis), but the supervisor assigns the queues and took none
    # from it.
    record = tmp_path / "handled.rec"
    # A killed child's Redis leases lapse 2 s after its last renewal: the shipped 5 s
    # only makes the test wait.
    sup = Supervised(tmp_path, broker, "2:2", "tests.apps.recorder:app",
                     {"CONVEYOR_TEST_RECORD": str(record), "CONVEYOR_TEST_WORK_MS": "2",
                      "CONVEYOR_BALANCER__LEASE_TTL_S": "2"})
    supervised.append(sup)
    wait_until_sync(lambda: "2 process(es) own 8 queue(s)" in sup.stderr, 30, "two processes")
    n = 3000
    with sup.client() as client:
        client.publish_batch(Publish("items", f"k{i % 100}", {"seq": i}) for i in range(n))
    wait_until_sync(lambda: len(read_records([record])) >= 300, 30, "work under way")
    victim = sup.live_children()[0]
    victim.suspend()
    # Never resumed: everything must be handled by the others meanwhile.
    wait_until_sync(lambda: "has sent nothing for" in sup.stderr, SILENT_CHILD_S + 5,
                    "the supervisor to kill the stopped child")
    wait_until_sync(lambda: len({r[5] for r in read_records([record])}) >= n, 60,
                    "every message handled while the child stays stopped")
    wait_until_sync(lambda: len(sup.live_children()) == 2, 10, "a replacement process")
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE
    assert sup.stop() == 0, sup.stderr
    log = sup.stderr
    assert "Traceback" not in log, log
    ids = Counter(r[5] for r in read_records([record]))
    assert len(ids) == n, "a message was lost"
    # At least once: only what the stopped child had pulled and not acknowledged comes
    # again, at most its cache on each of the 4 queues it owned.
    assert sum(ids.values()) - n <= 4 * CACHE


def test_a_child_blocking_its_loop_past_the_silence_limit_is_not_killed(
    broker: Broker, tmp_path: Path, supervised: list[Supervised]
) -> None:
    # The beat comes from a thread of the child's own: a handler's time.sleep in an
    # async def blocks the loop, not the beat (its lease deals with the loop: 3 s is
    # within the shipped 5 s lease's tolerance, so the blocker runs once).
    record = tmp_path / "handled.rec"
    sup = Supervised(tmp_path, broker, "1:1", "tests.apps.blocking_app:app",
                     {"CONVEYOR_TEST_RECORD": str(record),
                      "CONVEYOR_SUPERVISOR__SILENT_CHILD_S": "1"})
    supervised.append(sup)
    wait_until_sync(lambda: "1 process(es) own 8 queue(s)" in sup.stderr, 30, "the process")
    with sup.client() as client:
        client.publish_batch([Publish("items", "k0", {"seq": 0, "block_s": 3.0}),
                              Publish("items", "k1", {"seq": 1})])

    def seqs() -> list[int]:  # blocking_app's lines: time pid queue key seq id deliveries
        return sorted(int(line.split()[4]) for line in record.read_text().splitlines()
                      ) if record.exists() else []

    wait_until_sync(lambda: len(seqs()) >= 2, 30, "both handled")
    assert sup.stop() == 0, sup.stderr
    log = sup.stderr
    assert "has sent nothing" not in log and "died" not in log, log
    assert seqs() == [0, 1]



@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_paused_supervisor_does_not_blame_its_children_for_its_own_pause(
    broker: Broker, tmp_path: Path, supervised: list[Supervised]
) -> None:
    # The children's beats wait unread in the pipes while the supervisor is stopped; on
    # SIGCONT it counts silence from when it runs again, so no child is killed. (One
    # broker is enough: this is the supervisor's own clock.)
    record = tmp_path / "handled.rec"
    sup = Supervised(tmp_path, broker, "2:2", "tests.apps.recorder:app",
                     {"CONVEYOR_TEST_RECORD": str(record)})
    supervised.append(sup)
    wait_until_sync(lambda: "2 process(es) own 8 queue(s)" in sup.stderr, 30, "two processes")
    children = {c.pid for c in sup.live_children()}
    sup.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(3 * SILENT_CHILD_S)  # the pause under test
    finally:
        sup.proc.send_signal(signal.SIGCONT)
    with sup.client() as client:  # the children still work for it afterwards
        client.publish_batch(Publish("items", f"k{i}", {"seq": i}) for i in range(100))
    wait_until_sync(lambda: len(read_records([record])) >= 100, 30, "all handled")
    assert {c.pid for c in sup.live_children()} == children
    assert sup.stop() == 0, sup.stderr
    assert "has sent nothing" not in sup.stderr, sup.stderr
