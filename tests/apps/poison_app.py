"""Test app for `conveyor dlq`: a handler that fails on poison until it is "fixed".

A body ``{"n": N, "poison": true}`` raises ``ValueError("poison N")`` while the file named
by ``CONVEYOR_TEST_FIXED`` does not exist (the fix an operator deploys); everything else
is handled. Each handled message appends one flushed line ``N MESSAGE-ID REPLAY-OF``
(``-`` when not a replay) to the file named by ``CONVEYOR_TEST_OUT``.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from conveyor import App, MessageContext


class Job(msgspec.Struct):
    n: int
    poison: bool = False


app = App("dlq-e2e")
_out = open(os.environ.get("CONVEYOR_TEST_OUT", os.devnull), "a", buffering=1)  # noqa: SIM115
_fixed = os.environ.get("CONVEYOR_TEST_FIXED", "/nonexistent/fixed")


@app.handler("jobs", name="jobs.handle", retry_attempts=2, retry_delay_s=0.01)
async def handle(job: Job, ctx: MessageContext) -> None:
    if job.poison and not await asyncio.to_thread(os.path.exists, _fixed):
        raise ValueError(f"poison {job.n}")
    replay_of = ctx.message.headers.get("cv-replay-of") or "-"
    _out.write(f"{job.n} {ctx.message.id} {replay_of}\n")
