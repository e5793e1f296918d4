"""Handles "jobs" and records "seq" lines; publishes nothing (the test publishes).

A job with ``fail = n`` raises on its first ``n`` attempts (``-1``: on every attempt,
so it is dead-lettered after three); the attempt number comes from the message, so
the app keeps no state.
"""

from __future__ import annotations

import os

import msgspec

from conveyor import App, MessageContext

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
app = App(os.environ.get("CONVEYOR_TEST_APP", "traced-redis"))


class Job(msgspec.Struct):
    seq: int
    fail: int = 0


@app.handler("jobs", retry_attempts=3, retry_delay_s=0.01)
async def on_job(job: Job, ctx: MessageContext) -> None:
    if job.fail < 0 or ctx.attempt < job.fail:
        raise RuntimeError(f"job {job.seq} fails on attempt {ctx.attempt + 1}")
    with open(OUT, "a") as f:  # noqa: ASYNC230 - a test app
        f.write(f"{job.seq}\n")
