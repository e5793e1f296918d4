"""tests.apps.stop_app with a plain ``def`` handler: each "jobs" call appends "id seq" to
CONVEYOR_TEST_OUT.started, blocks its thread in ``time.sleep`` for CONVEYOR_TEST_WORK_MS
(a stuck handler: a long time), then appends "id seq" to CONVEYOR_TEST_OUT."""

from __future__ import annotations

import os
import time

from conveyor import App, MessageContext

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
WORK_S = float(os.environ.get("CONVEYOR_TEST_WORK_MS", "0")) / 1000

app = App("stop-test")
_out = open(OUT, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
_started = open(OUT + ".started", "a", buffering=1)  # noqa: SIM115 - as long as the process


@app.handler("jobs")
def on_job(job: dict[str, int], ctx: MessageContext) -> None:
    _started.write(f"{ctx.message.id} {job['seq']}\n")
    time.sleep(WORK_S)
    _out.write(f"{ctx.message.id} {job['seq']}\n")
