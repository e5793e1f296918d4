"""Test app: an ``async def`` handler that blocks its event loop on some messages.

A body ``{"seq": N, "block_s": S}`` calls ``time.sleep(S)`` inside the coroutine (the
mistake users make: a blocking client in an ``async def``). Each handled message appends
one flushed line ``<time> <pid> <queue> <stream-key> <seq> <id> <deliveries>`` to the file
named by ``CONVEYOR_TEST_RECORD``; a start appends the same to ``CONVEYOR_TEST_STARTS``
(if set) before blocking. ``CONVEYOR_TEST_EXIT_ON``, if set, names a seq whose handling
kills the process with ``os._exit(1)`` (a crash no ``except`` catches) — or, as
``CONVEYOR_TEST_EXIT_HOW`` says, raises ``KeyboardInterrupt`` or ``SystemExit(3)``
beside a thread that never ends (one the app started, not a daemon thread),
segfaults (``ctypes.string_at(0)``), or forks a process that outlives it by a minute
(as a ``multiprocessing`` child may; its pid appended to ``CONVEYOR_TEST_RECORD``
``.forks``) before its ``os._exit(1)``;
``CONVEYOR_TEST_MAX_DELIVERIES`` sets the handler's ``max_deliveries`` (default 5).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import msgspec

from conveyor import App, MessageContext


class Item(msgspec.Struct):
    seq: int
    block_s: float = 0.0


app = App("rec")
_out = open(os.environ.get("CONVEYOR_TEST_RECORD", os.devnull), "a", buffering=1)  # noqa: SIM115
_starts = (open(os.environ["CONVEYOR_TEST_STARTS"], "a", buffering=1)  # noqa: SIM115
           if os.environ.get("CONVEYOR_TEST_STARTS") else None)
_exit_on = int(os.environ.get("CONVEYOR_TEST_EXIT_ON") or -1)
_exit_how = os.environ.get("CONVEYOR_TEST_EXIT_HOW", "os._exit")
_pid = os.getpid()


def _line(item: Item, ctx: MessageContext) -> str:
    msg = ctx.message
    queue = msg.token.queue if msg.token else -1
    deliveries = ctx.deliveries
    return f"{time.time():.3f} {_pid} {queue} {msg.stream.key} {item.seq} {msg.id} {deliveries}\n"


@app.handler("items", retry_attempts=1,
             max_deliveries=int(os.environ.get("CONVEYOR_TEST_MAX_DELIVERIES") or 5))
async def on_item(item: Item, ctx: MessageContext) -> None:
    if _starts is not None:
        _starts.write(_line(item, ctx))
    if item.seq == _exit_on:
        _exit()
    if item.block_s:
        time.sleep(item.block_s)  # noqa: ASYNC251 - the point of this app
    _out.write(_line(item, ctx))


def _exit() -> None:
    if _exit_how in ("KeyboardInterrupt", "SystemExit"):
        threading.Thread(target=threading.Event().wait, name="forever").start()
        raise KeyboardInterrupt if _exit_how == "KeyboardInterrupt" else SystemExit(3)
    if _exit_how == "segfault":
        ctypes.string_at(0)
    if _exit_how == "fork":
        pid = os.fork()
        if pid == 0:
            threading.Event().wait(60)
            os._exit(0)
        with open(os.environ["CONVEYOR_TEST_RECORD"] + ".forks", "a") as forks:
            forks.write(f"{pid}\n")
    os._exit(1)
