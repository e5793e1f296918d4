"""A test app for stop tests: each "jobs" handler call appends "id seq" to
CONVEYOR_TEST_OUT.started, takes CONVEYOR_TEST_WORK_MS (a stuck handler: a long time),
then appends "id seq" to CONVEYOR_TEST_OUT. ``sync_app``: the same as a plain ``def``."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from conveyor import App, MessageContext

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
WORK_S = float(os.environ.get("CONVEYOR_TEST_WORK_MS", "0")) / 1000

app = App("stop-test")
_out = open(OUT, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
_started = open(OUT + ".started", "a", buffering=1)  # noqa: SIM115 - as long as the process
_poller = open(OUT + ".poller", "a", buffering=1)  # noqa: SIM115 - as long as the process


@app.handler("jobs")
async def on_job(job: dict[str, int], ctx: MessageContext) -> None:
    _started.write(f"{ctx.message.id} {job['seq']}\n")
    await asyncio.sleep(WORK_S)
    _out.write(f"{ctx.message.id} {job['seq']}\n")


sync_app = App("stop-test")
"""The same, with a plain ``def`` handler: it blocks its thread in ``time.sleep``."""


@sync_app.handler("jobs")
def on_job_in_thread(job: dict[str, int], ctx: MessageContext) -> None:
    _started.write(f"{ctx.message.id} {job['seq']}\n")
    time.sleep(WORK_S)
    _out.write(f"{ctx.message.id} {job['seq']}\n")


to_thread_app = App("stop-test")
"""The same, its wait in ``asyncio.to_thread``: on the loop's default executor, whose
threads Python waits for at exit."""


@to_thread_app.handler("jobs")
async def on_job_to_thread(job: dict[str, int], ctx: MessageContext) -> None:
    _started.write(f"{ctx.message.id} {job['seq']}\n")
    await asyncio.to_thread(time.sleep, WORK_S)
    _out.write(f"{ctx.message.id} {job['seq']}\n")


thread_app = App("stop-test")
"""The async app's handler, and a startup hook that starts a thread which never ends and
is not a daemon thread (as an app's poller started at import)."""
thread_app.handlers.extend(app.handlers)


@thread_app.startup
async def start_poller(client: object) -> None:
    threading.Thread(target=lambda: time.sleep(3600), name="app-poller").start()
    _poller.write("started\n")  # the hook runs beside the handlers: a test that stops
    # the worker waits for this line too
