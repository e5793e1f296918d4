"""Test app for Kafka subprocess tests: one flushed line per handled message.

Each line is ``ID KEY SEQ PID`` appended to the file named by ``CONVEYOR_TEST_OUT``
(``ID KEY SEQ PID TIME`` with ``CONVEYOR_TEST_STAMP=1``: the wall-clock time the call
ended); ``CONVEYOR_TEST_SLEEP_MS`` makes the handler take that long. The app (and so
its Kafka consumer group) is ``kafka-sub`` unless ``CONVEYOR_TEST_APP`` names another:
groups live as long as the session's broker, so a test may want one of its own.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from conveyor import App

app = App(os.environ.get("CONVEYOR_TEST_APP", "kafka-sub"))
_out = open(os.environ["CONVEYOR_TEST_OUT"], "a", buffering=1)  # noqa: SIM115 - lives with the process
_sleep_s = float(os.environ.get("CONVEYOR_TEST_SLEEP_MS", "0")) / 1000
_pid = os.getpid()
_stamp = os.environ.get("CONVEYOR_TEST_STAMP") == "1"


@app.handler("jobs")
async def handle(body: dict[str, Any]) -> None:
    if _sleep_s:
        await asyncio.sleep(_sleep_s)
    if _stamp:
        _out.write(f"{body['id']} {body['k']} {body['seq']} {_pid} {time.time():.3f}\n")
    else:
        _out.write(f"{body['id']} {body['k']} {body['seq']} {_pid}\n")
