"""Test app for the hostile-input runs (tests/integration/kafka/test_kafka_hostile.py):
every message it handles is one JSON line in the file named by ``CONVEYOR_TEST_OUT``.

Namespace ``jobs`` takes JSON objects, ``default`` (the shipped configs'
``default_namespace``: records without ``cv-ns``) too, ``big`` takes raw bytes and
records their length.
"""

from __future__ import annotations

import json
import os
from typing import Any

from conveyor import App, MessageContext

app = App(os.environ.get("CONVEYOR_TEST_APP", "hostile"))
_out = open(os.environ["CONVEYOR_TEST_OUT"], "a", buffering=1)  # noqa: SIM115 - lives with the process


def _record(body: Any, ctx: MessageContext) -> None:
    msg = ctx.message
    _out.write(json.dumps({"ns": msg.stream.namespace, "key": msg.stream.key, "id": msg.id,
                           "body": body, "content_type": msg.content_type,
                           "headers": len(msg.headers), "case": msg.headers.get("x-case")})
               + "\n")


@app.handler("jobs", retry_attempts=1)
async def jobs(body: dict[str, Any], ctx: MessageContext) -> None:
    _record(body, ctx)


@app.handler("default", retry_attempts=1)
async def default(body: dict[str, Any], ctx: MessageContext) -> None:
    _record(body, ctx)


@app.handler("big", retry_attempts=1)
async def big(body: bytes, ctx: MessageContext) -> None:
    _record(len(body), ctx)
