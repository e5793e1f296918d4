"""A test app for stops held by a handler: each "jobs" call appends ``start PID SEQ`` to
the file named by CONVEYOR_TEST_OUT when it begins and ``done PID SEQ`` when it ends.

A body with ``stuck`` set gets stuck in the first process that starts it (the one that
creates ``CONVEYOR_TEST_OUT.stuck``), in a handler that catches its cancellation every
time and goes on — the habit under test (a bare ``except:`` around an await in a loop);
a later start of it (the next owner's) is handled at once. The app, and so its Kafka
consumer group, is named by CONVEYOR_TEST_APP (default ``stuck-stop``).
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from conveyor import App

OUT = os.environ.get("CONVEYOR_TEST_OUT", os.devnull)
app = App(os.environ.get("CONVEYOR_TEST_APP", "stuck-stop"))
_out = open(OUT, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
_pid = os.getpid()


class Job(msgspec.Struct):
    seq: int
    stuck: bool = False


def _first_to_get_stuck() -> bool:
    try:
        os.close(os.open(OUT + ".stuck", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@app.handler("jobs")
async def on_job(job: Job) -> None:
    _out.write(f"start {_pid} {job.seq}\n")
    if job.stuck and _first_to_get_stuck():
        while True:
            try:
                await asyncio.sleep(3600)
            except BaseException:  # the mistake under test
                _out.write(f"caught {_pid} {job.seq}\n")
    _out.write(f"done {_pid} {job.seq}\n")
