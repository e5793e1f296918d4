"""A handler that cancels its own task (``asyncio.current_task().cancel()``, or a library
that leaves it cancelled) raises ``CancelledError`` with its task cancelled, which the
agent takes for its own stop: its runner ended, the message stayed unfinished and its
stream stuck behind it, and the worker ran on without a word until it was stopped. The
worker fails instead, in one line, as for an agent task that crashed: it drains, exits 1,
and its restart handles what it held. Nothing is lost. (Its restart runs the message
again: one that cancels its task every time becomes a DeliveryLimit dead letter after
max_deliveries, as one that kills its worker does.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reaped, wait_until_sync
from tests.integration.redis.test_redis_stop import config_file, publish
from tests.servers import RedisServer

APP = """\
import asyncio, os
from conveyor import App
app = App("stop-test")
CANCEL = bool(os.environ.get("CANCEL_ITSELF"))
def write(seqs: list[int]) -> None:
    with open(os.environ["OUT"], "a") as out:
        out.write("".join(f"{seq}\\n" for seq in seqs))
if os.environ.get("BATCH"):
    @app.handler("jobs", batch_size=5, batch_wait_ms=10)
    async def on_jobs(jobs: list[dict[str, int]]) -> None:
        if CANCEL and any(job["seq"] == 5 for job in jobs):
            asyncio.current_task().cancel()
            await asyncio.sleep(0)
        write([job["seq"] for job in jobs])
else:
    @app.handler("jobs")
    async def on_job(job: dict[str, int]) -> None:
        if CANCEL and job["seq"] == 5:
            asyncio.current_task().cancel()
            await asyncio.sleep(0)
        write([job["seq"]])
"""

def worker(tmp_path: Path, config: Path, out: Path, cancel: bool, batch: bool
           ) -> subprocess.Popen[str]:
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(tmp_path) + os.pathsep
           + os.environ.get("PYTHONPATH", ""), **({"CANCEL_ITSELF": "1"} if cancel else {}),
           **({"BATCH": "1"} if batch else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "canceller:app", "--config",
         str(config)], cwd=Path(__file__).resolve().parents[3], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch-handler"])
def test_a_handler_that_cancels_its_own_task_fails_the_worker_and_loses_nothing(
    redis_server: RedisServer, tmp_path: Path, batch: bool,
) -> None:
    (tmp_path / "canceller.py").write_text(APP)
    config = config_file(tmp_path, f"redis://127.0.0.1:{redis_server.port}/0")
    out = tmp_path / "handled.txt"
    published = publish(config, keys=4, per_key=5)  # seq 5 heads stream k1
    with reaped(worker(tmp_path, config, out, cancel=True, batch=batch)) as first:
        status = first.wait(30)  # by itself, not stopped
        said = first.communicate()[1]
    assert status == 1, said
    [line] = [x for x in said.splitlines() if x.startswith("conveyor: error:")]
    what = (r"batch handler canceller\.on_jobs was cancelled on a batch of \d+ "
            r"message\(s\) from \w+ on" if batch else
            r"handler canceller\.on_job was cancelled on message \w+ of jobs/k1")
    assert re.fullmatch(
        rf"conveyor: error: queue \d: an agent task crashed \(ConveyorError: {what} "
        r"though nothing stopped its queue \(a handler that cancels its own task: "
        r"asyncio\.current_task\(\)\.cancel\(\), or a library that leaves it "
        r"cancelled\)\); the worker stops so that a restart redelivers what it held",
        line), said
    handled = out.read_text().split() if out.exists() else []
    assert "5" not in handled and len(handled) < published, said
    with reaped(worker(tmp_path, config, out, cancel=False, batch=batch)) as second:
        wait_until_sync(lambda: len(set(out.read_text().split())) == published
                        or second.poll() is not None, 30, "the restart to handle the rest")
    seqs = [int(x) for x in out.read_text().split()]
    assert sorted(set(seqs)) == list(range(published))
    assert len(seqs) == published  # the first drained what it had handled: no repeats
