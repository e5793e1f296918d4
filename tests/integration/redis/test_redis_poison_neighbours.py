"""A message that kills its worker must not drag finished neighbours into the dead letters.

From its second counted start on, a redelivered message runs alone in its daemon and
is acknowledged before the next redelivered one starts, so a poison message on the
same queue is not blamed on it again (docs/handlers.md, "Failures"). On Redis the
done prefix alone did not do it: a message that ran alone behind an unfinished one (a
redelivered message of another stream whose turn had not come) stayed unacknowledged,
the poison crashed the process, and its next owner counted one more delivery against
it. In the fault walk (10,000 messages over 200 streams, 3 ``os._exit`` poisons, two
``conveyor worker`` processes restarted as they died) 29 messages that had each been
handled 4 times became ``DeliveryLimit`` letters beside the 3 poisons.

Here, on one queue: stream ``a`` holds 20 messages, ``b20`` to ``b24`` one each, ``p``
the poison, published last. Once redelivered, each message's start is counted under
the daemon's one lock, so ``a``'s lane goes back behind the others after each message:
the ``b`` messages and the poison run while ``a``'s next message is unfinished. A
message that has run alone must never run again. Duplicates allowed: the runs of
messages at their first two deliveries (started beside the poison, which killed the
process before their acknowledgement).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.client import Publish, SyncClient
from conveyor.platform.config import load_config
from conveyor.platform.message import DeadLetter
from tests.conftest import wait_until_sync
from tests.integration.poison import rows_of, stored_letters
from tests.integration.redis.conftest import REPO, RedisServer

pytestmark = pytest.mark.slow

POISON = 25
BODIES = ([("a", seq) for seq in range(20)] + [(f"b{seq}", seq) for seq in range(20, 25)]
          + [("p", POISON)])


def test_a_message_that_ran_alone_is_acknowledged_before_the_poison_behind_it_runs(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    shipped = REPO / "configs" / "redis.toml"
    record, starts = tmp_path / "handled.rec", tmp_path / "started.rec"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "CONVEYOR_REDIS__URL": redis_server.url,
           "CONVEYOR_QUEUES__TOTAL": "1",  # every stream on one queue, one agent
           "CONVEYOR_BALANCER__LEASE_TTL_S": "2",  # each crash waits out the lease
           "CONVEYOR_TEST_RECORD": str(record), "CONVEYOR_TEST_STARTS": str(starts),
           "CONVEYOR_TEST_EXIT_ON": str(POISON)}
    config = load_config(shipped, environ=env)

    def letters() -> list[DeadLetter]:
        return stored_letters(config)

    with SyncClient.from_config(config) as client:
        client.publish_batch(Publish("items", key, {"seq": seq}) for key, seq in BODIES)

    exits: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        def settled() -> bool:
            nonlocal proc
            if proc is not None and proc.poll() is not None:
                exits.append(proc.returncode)  # the poison's os._exit(1): start another
                proc = None
            if proc is None:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "conveyor.cli", "worker",
                     "tests.apps.blocking_app:app", "--config", str(shipped)],
                    cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                    stderr=open(tmp_path / f"worker{len(exits)}.err", "wb"))  # noqa: SIM115
            handled = {int(row[4]) for row in rows_of([record])}
            return handled == set(range(POISON)) and len(letters()) >= 1

        wait_until_sync(settled, 90,
                        "every message handled and the poison dead-lettered")
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    [letter] = letters()
    assert letter.error_type == "DeliveryLimit" and b'"seq":25' in letter.message.body, letter
    assert exits == [1] * 5, exits  # max_deliveries = 5 starts of the poison
    runs: dict[int, list[int]] = {}
    for row in rows_of([record]):
        runs.setdefault(int(row[4]), []).append(int(row[6]))
    for seq, deliveries in runs.items():
        alone = [d for d in deliveries if d >= 3]  # from its second counted start on
        assert len(alone) <= 1, (
            f"seq {seq} ran alone {len(alone)} times (deliveries {deliveries}): a message "
            f"that ran alone to its end was not acknowledged before the poison ran")
    print(f"\nruns per message (their deliveries): {runs}; worker exits: {exits}")
