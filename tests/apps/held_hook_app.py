"""A test app for stops held by a startup hook: a poller (``@app.startup``) that catches
its cancellation every time and goes on — the habit under test (``except
asyncio.CancelledError: pass`` around an await, in a loop) — and a "jobs" handler that
appends ``done PID SEQ`` to the file named by CONVEYOR_TEST_OUT. The hook appends
``hook PID`` there once it runs, and ``caught PID`` at each cancellation it swallows.
The app is named by CONVEYOR_TEST_APP (default ``held-hook``).
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from conveyor import App, Client

OUT = os.environ.get("CONVEYOR_TEST_OUT", os.devnull)
app = App(os.environ.get("CONVEYOR_TEST_APP", "held-hook"))
_out = open(OUT, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
_pid = os.getpid()


class Job(msgspec.Struct):
    seq: int


@app.startup
async def poll_forever(client: Client) -> None:
    _out.write(f"hook {_pid}\n")
    while True:
        try:
            await asyncio.sleep(0.1)
        except asyncio.CancelledError:  # the mistake under test
            _out.write(f"caught {_pid}\n")


@app.handler("jobs")
async def on_job(job: Job) -> None:
    _out.write(f"done {_pid} {job.seq}\n")
