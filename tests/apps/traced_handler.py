"""Handles "jobs" and records "seq" lines; publishes nothing (the test publishes)."""

from __future__ import annotations

import os

import msgspec

from conveyor import App

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
app = App("traced-redis")


class Job(msgspec.Struct):
    seq: int


@app.handler("jobs")
async def on_job(job: Job) -> None:
    with open(OUT, "a") as f:  # noqa: ASYNC230 - a test app
        f.write(f"{job.seq}\n")
