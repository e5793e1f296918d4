"""Test app: handlers that copy their worker with a bare ``os.fork()`` on some messages,
and whose forked process does not end itself (no ``os._exit``): it goes back into the
worker as the handler's call would.

A body ``{"seq": N, "text": T}``; each message a handler finishes appends one flushed line
``<pid> <seq> <text> <deliveries>`` to the file named by ``CONVEYOR_TEST_RECORD`` (the
pid of the process that wrote it: a copy's lines are told apart). A message whose seq
``CONVEYOR_TEST_FORK_EVERY`` divides forks first; the forked process appends its pid to
``CONVEYOR_TEST_RECORD`` ``.forks`` and then, as ``CONVEYOR_TEST_FORK_HOW`` says,
``returns`` from the handler, ``awaits`` a second on the event loop and returns
(``async def`` only), or ``raises`` an error. ``app`` has an ``async def`` handler,
``sync_app`` a plain ``def`` one (run on a handler thread).
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from conveyor import App, MessageContext


class Item(msgspec.Struct):
    seq: int
    text: str


app = App("forks")
sync_app = App("forks")
_out = open(os.environ.get("CONVEYOR_TEST_RECORD", os.devnull), "a", buffering=1)  # noqa: SIM115
_forks = os.environ.get("CONVEYOR_TEST_RECORD", os.devnull) + ".forks"
_every = int(os.environ.get("CONVEYOR_TEST_FORK_EVERY") or 10)
_how = os.environ.get("CONVEYOR_TEST_FORK_HOW", "returns")


def _forked(item: Item) -> bool:
    """Fork on the messages it is asked to: True in the forked process."""
    if item.seq % _every or os.fork():
        return False
    with open(_forks, "a") as forks:
        forks.write(f"{os.getpid()}\n")
    if _how == "raises":
        raise RuntimeError("the forked process's error")
    return True


def _record(item: Item, ctx: MessageContext) -> None:
    _out.write(f"{os.getpid()} {item.seq} {item.text} {ctx.deliveries}\n")


@app.handler("items", retry_attempts=1)
async def on_item(item: Item, ctx: MessageContext) -> None:
    loop = asyncio.get_running_loop()  # (in a forked process, asyncio finds no loop)
    if _forked(item):
        if _how == "awaits":  # a second, in which the worker's other tasks would run
            waited = loop.create_future()
            loop.call_later(1.0, waited.set_result, None)
            await waited
        return
    _record(item, ctx)


@sync_app.handler("items", retry_attempts=1)
def on_item_in_thread(item: Item, ctx: MessageContext) -> None:
    if _forked(item):
        return
    _record(item, ctx)
