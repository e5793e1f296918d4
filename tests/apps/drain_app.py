"""A test app for `conveyor worker` subprocesses on the memory adapter.

On startup it publishes CONVEYOR_TEST_MESSAGES messages (ids written to OUT.published);
its handler takes CONVEYOR_TEST_WORK_MS per message and appends "id key seq" to OUT,
one flushed line per handled message, so a test can count after a signal.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from conveyor import App, Client, MessageContext, Publish

OUT = os.environ.get("CONVEYOR_TEST_OUT", "/dev/null")
MESSAGES = int(os.environ.get("CONVEYOR_TEST_MESSAGES", "1000"))
WORK_S = float(os.environ.get("CONVEYOR_TEST_WORK_MS", "5")) / 1000

app = App("drain-test")


class Job(msgspec.Struct):
    seq: int


@app.startup
async def publish_jobs(client: Client) -> None:
    items = [Publish("jobs", f"k{i % 50}", Job(i)) for i in range(MESSAGES)]
    msgs = [client.build(p.namespace, p.key, p.body) for p in items]
    with open(OUT + ".published", "w") as f:  # noqa: ASYNC230 - once, at startup
        f.writelines(f"{m.id}\n" for m in msgs)
    for m in msgs:
        await client.adapter.enqueue(client.mapper.queue_for(m.stream), [m])


_out = open(OUT, "a", buffering=1)  # noqa: SIM115 - lives as long as the process


@app.handler("jobs")
async def on_job(job: Job, ctx: MessageContext) -> None:
    await asyncio.sleep(WORK_S)
    _out.write(f"{ctx.message.id} {ctx.message.stream.key} {job.seq}\n")
