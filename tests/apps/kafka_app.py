"""Test app for Kafka subprocess tests: one flushed line per handled message.

Each line is ``ID KEY SEQ PID`` appended to the file named by ``CONVEYOR_TEST_OUT``;
``CONVEYOR_TEST_SLEEP_MS`` makes the handler take that long.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from conveyor import App

app = App("kafka-sub")
_out = open(os.environ["CONVEYOR_TEST_OUT"], "a", buffering=1)  # noqa: SIM115 - lives with the process
_sleep_s = float(os.environ.get("CONVEYOR_TEST_SLEEP_MS", "0")) / 1000
_pid = os.getpid()


@app.handler("jobs")
async def handle(body: dict[str, Any]) -> None:
    if _sleep_s:
        await asyncio.sleep(_sleep_s)
    _out.write(f"{body['id']} {body['k']} {body['seq']} {_pid}\n")
