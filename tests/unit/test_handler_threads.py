"""HandlerThreads: plain-``def`` calls on threads, bounded by a live limit, abandonable."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest

from conveyor import App, HandlerDeclarationError
from conveyor.client import Client
from conveyor.platform.errors import ShutdownError
from conveyor.workers.threads import HandlerThreads
from tests.conftest import wait_until

REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="unset")


def blocker(gate: threading.Event, ran: list[str], name: str) -> str:
    ran.append(name)
    assert gate.wait(10), "the test never opened the gate"
    return name


async def test_a_call_runs_on_a_thread_in_a_copy_of_the_callers_context() -> None:
    threads = HandlerThreads(lambda: 4)
    REQUEST.set("r-17")
    seen = await threads.run(lambda: (REQUEST.get(), threading.current_thread().name))
    assert seen[0] == "r-17"
    assert seen[1].startswith("conveyor-handler-")
    threads.close()


async def test_a_calls_exception_reaches_its_awaiter() -> None:
    threads = HandlerThreads(lambda: 1)

    def fail() -> None:
        raise ValueError("from the thread")

    with pytest.raises(ValueError, match="from the thread"):
        await threads.run(fail)
    assert threads.running == 0
    threads.close()


async def test_a_plain_function_returning_a_coroutine_fails_clearly() -> None:
    async def inner() -> None: ...

    threads = HandlerThreads(lambda: 1)
    with pytest.raises(HandlerDeclarationError, match="returned a coroutine"):
        await threads.run(inner)  # an async function handed over as if it were plain
    threads.close()


async def test_an_abandoned_call_keeps_its_place_so_new_calls_wait_instead_of_adding_threads(
) -> None:
    """Limit 2 (two slots out), both busy; one awaiter gives up (a drain time-out): its
    thread runs on, so a third call is held, not given a third thread, until it returns."""
    threads = HandlerThreads(lambda: 2)
    gates = [threading.Event() for _ in range(3)]
    ran: list[str] = []
    first = threads.run(blocker, gates[0], ran, "first")
    second = threads.run(blocker, gates[1], ran, "second")
    await wait_until(lambda: len(ran) == 2, what="two calls on threads")
    first.cancel()  # abandoned: the thread cannot be interrupted
    third = threads.run(blocker, gates[2], ran, "third")
    assert len(threads.held) == 1 and threads.running == 2
    gates[0].set()  # the abandoned call returns: its place goes to the held one
    await wait_until(lambda: "third" in ran, what="the held call started")
    gates[1].set()
    gates[2].set()
    assert await second == "second" and await third == "third"
    assert first.cancelled()
    assert threads.peak_running == 2 and threads.peak_threads == 2
    threads.close()


async def test_a_call_given_up_before_a_thread_took_it_never_runs() -> None:
    threads = HandlerThreads(lambda: 1)
    gate = threading.Event()
    ran: list[str] = []
    first = threads.run(blocker, gate, ran, "first")
    skipped = threads.run(blocker, gate, ran, "skipped")  # held: the limit is 1
    skipped.cancel()  # a drain gave up on it
    gate.set()
    assert await first == "first"
    await wait_until(lambda: threads.running == 0 and not threads.held, what="all returned")
    assert ran == ["first"]
    threads.close()


async def test_the_limit_is_read_live_so_more_slots_let_more_calls_run() -> None:
    slots_out = 1
    threads = HandlerThreads(lambda: slots_out)
    gate = threading.Event()
    ran: list[str] = []
    a = threads.run(blocker, gate, ran, "a")
    b = threads.run(blocker, gate, ran, "b")
    assert len(threads.held) == 1
    slots_out = 2  # the supplier issued another slot (resource-based, say)
    c = threads.run(blocker, gate, ran, "c")  # the held call goes first, c waits
    await wait_until(lambda: len(ran) == 2, what="two calls running")
    assert sorted(ran) == ["a", "b"] and len(threads.held) == 1
    gate.set()
    assert [await f for f in (a, b, c)] == ["a", "b", "c"]
    threads.close()


async def test_idle_threads_end_and_close_waits_for_no_running_call() -> None:
    threads = HandlerThreads(lambda: 3, idle_s=0.05)
    await asyncio.gather(*(threads.run(lambda: None) for _ in range(3)))
    assert threads.peak_threads <= 3
    await wait_until(lambda: threads.threads == 0, 5, what="idle threads to end")
    gate = threading.Event()
    ran: list[str] = []
    running = threads.run(blocker, gate, ran, "stuck")
    await wait_until(lambda: ran == ["stuck"], what="the call to start")
    running.cancel()
    threads.close()  # returns at once: the thread is a daemon thread, abandoned
    assert threads.threads == 1
    with pytest.raises(ShutdownError):
        threads.run(lambda: None)
    gate.set()
    await wait_until(lambda: threads.threads == 0, 5, what="the abandoned thread to end")


def test_a_plain_def_handler_is_accepted_and_marked_sync() -> None:
    app = App("t")

    @app.handler("a")
    def plain(body: bytes) -> None: ...

    @app.handler("b")
    async def coro(body: bytes) -> None: ...

    assert [h.sync for h in app.handlers] == [True, False]


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("def h() -> None: ...", "takes \\(body\\)"),
        ("def h(body: dict, ctx: object, extra: int) -> None: ...", "takes \\(body\\)"),
        ("def h(body) -> None: ...", "annotate the first parameter"),
        ("import functools\nasync def inner(body: dict) -> None: ...\n"
         "@functools.wraps(inner)\ndef h(*a, **k): return inner(*a, **k)",
         "wrapping an `async def`"),
        ("class H:\n    def __call__(self, body: dict) -> None: ...\nh = H()", "not a function"),
    ],
)
def test_wrong_shapes_of_plain_def_handlers_are_refused_clearly(source: str, match: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(HandlerDeclarationError, match=match):
        App("t").handler("orders")(namespace["h"])


def test_a_plain_def_startup_hook_is_refused_at_declaration() -> None:
    def hook(client: Client) -> None: ...

    with pytest.raises(HandlerDeclarationError, match=r"startup hook .*async def"):
        App("t").startup(hook)  # type: ignore[arg-type]
