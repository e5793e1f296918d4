"""A test app for worker subprocesses: an ``idempotent=True`` handler with a gate.

Each call appends ``start <pid> <seq> <id>`` when it begins and ``end <pid> <seq> <id>``
when it completes (its side effect) to ``CONVEYOR_TEST_RECORD``, flushed per line. The
message whose ``seq`` is ``CONVEYOR_TEST_GATE_SEQ`` waits, between the two, until the
file ``CONVEYOR_TEST_GATE`` exists — so a test can stop or kill a daemon while that
message is mid-handler and every other runner is between messages.
``CONVEYOR_TEST_CLAIM_S`` sets ``idempotency_claim_s``; ``CONVEYOR_TEST_IDEMPOTENT=0``
turns the option off (the control).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec

from conveyor import App, MessageContext


class Item(msgspec.Struct):
    seq: int


app = App("once")
_out = open(os.environ.get("CONVEYOR_TEST_RECORD", os.devnull), "a", buffering=1)  # noqa: SIM115
_gate = Path(os.environ.get("CONVEYOR_TEST_GATE", "/nonexistent/gate"))
_gate_seq = int(os.environ.get("CONVEYOR_TEST_GATE_SEQ", "-1"))
_pid = os.getpid()
_options = (
    {"idempotent": True,
     "idempotency_claim_s": float(os.environ.get("CONVEYOR_TEST_CLAIM_S", "30"))}
    if os.environ.get("CONVEYOR_TEST_IDEMPOTENT", "1") == "1" else {}
)


@app.handler("items", **_options)
async def on_item(item: Item, ctx: MessageContext) -> None:
    _out.write(f"start {_pid} {item.seq} {ctx.message.id}\n")
    if item.seq == _gate_seq:
        # the gate is a file another process creates: polled, there is no event to await
        while not _gate.exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.02)
    _out.write(f"end {_pid} {item.seq} {ctx.message.id}\n")
