"""A test app that publishes through the daemon's Client (so producer spans exist)."""

from __future__ import annotations

import os

import msgspec

from conveyor import App, Client

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
app = App("traced")


class Job(msgspec.Struct):
    seq: int
    fail: int = 0


_failures: dict[int, int] = {}


@app.startup
async def publish(client: Client) -> None:
    await client.publish("jobs", "a", Job(1))
    await client.publish("jobs", "b", Job(2, fail=1))


@app.handler("jobs", retry_delay_s=0.001)
async def on_job(job: Job) -> None:
    if _failures.get(job.seq, 0) < job.fail:
        _failures[job.seq] = _failures.get(job.seq, 0) + 1
        raise RuntimeError("transient")
    with open(OUT, "a") as f:  # noqa: ASYNC230 - a test app
        f.write(f"{job.seq}\n")
