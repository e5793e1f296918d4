"""A test app for worker subprocesses: records every message it handles.

Each handled message appends one line ``<time> <pid> <queue> <stream-key> <seq> <id>``
to the file named by ``CONVEYOR_TEST_RECORD``, flushed per line, so a test can count
deliveries and check order even after the process was killed with SIGKILL.
``CONVEYOR_TEST_WORK_MS`` makes each message take that long (an await, not CPU).
``CONVEYOR_TEST_STARTS``, if set, names a file that gets the same line when a handler
*starts* a message (its time is the start's), before any await.
``CONVEYOR_TEST_SLOW_WHILE``, if set, names a file: while it exists, each message takes
another 50 ms, so a test can hold work on the queues until it has seen what it waits
for (a hand-off under load), then remove the file to let the rest drain at full speed.
"""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from conveyor import App, MessageContext


class Item(msgspec.Struct):
    seq: int


app = App("rec")
_out = open(os.environ.get("CONVEYOR_TEST_RECORD", os.devnull), "a", buffering=1)  # noqa: SIM115
_starts = (open(os.environ["CONVEYOR_TEST_STARTS"], "a", buffering=1)  # noqa: SIM115
           if os.environ.get("CONVEYOR_TEST_STARTS") else None)
_work_s = float(os.environ.get("CONVEYOR_TEST_WORK_MS", "0")) / 1000
_slow_while = os.environ.get("CONVEYOR_TEST_SLOW_WHILE", "")
SLOW_S = 0.05
_pid = os.getpid()


@app.handler("items")
async def on_item(item: Item, ctx: MessageContext) -> None:
    msg = ctx.message
    queue = msg.token.queue if msg.token else -1
    if _starts is not None:
        _starts.write(f"{time.time():.3f} {_pid} {queue} {msg.stream.key} {item.seq} {msg.id}\n")
    if _work_s:
        await asyncio.sleep(_work_s)
    if _slow_while and os.path.exists(_slow_while):  # noqa: ASYNC240 (one stat, tests only)
        await asyncio.sleep(SLOW_S)
    _out.write(f"{time.time():.3f} {_pid} {queue} {msg.stream.key} {item.seq} {msg.id}\n")
