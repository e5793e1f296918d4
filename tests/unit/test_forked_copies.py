"""A process a handler forks (a bare ``os.fork()``) that comes back into the worker's
code ends there, with status 70 (conveyor/platform/forks.py): in every place that awaits
a handler's call — the shipped chain's one step and the runner's inlined call of it, a
composed chain, a plain ``def`` handler's thread — whether the handler returns, raises or
awaits on the worker's loop, and for work an ``async def`` handler gave
``asyncio.to_thread``. Nothing after that place runs in it: not the dead-letter store's
put, not the rest of the chain.

Each test forks this process. A forked process that got past the place it must end
(without the fix) ends itself with 98 in the dead-letter put, or 99 where the test's own
code resumes: it never runs the rest of pytest. The forks end within
:data:`ENDS_WITHIN_S` (or the test kills them and fails).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from conveyor.platform import forks
from conveyor.platform.app import App
from conveyor.platform.delivery import (
    Delivery,
    DeliveryStats,
    build_chain,
    chain_interceptors,
)
from conveyor.platform.delivery.chain import call_handler, compose
from conveyor.platform.delivery.dead_letter import direct_call
from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import DeadLetter, Message
from conveyor.workers.threads import HandlerThreads

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork only")

ENDS_WITHIN_S = 5.0
PAST_THE_CALL, IN_THE_PUT = 99, 98
TEST_PID = os.getpid()


class Daemon:
    """What :func:`forks.guard` keys a running daemon by."""


@pytest.fixture
async def guarded() -> AsyncIterator[None]:
    daemon = Daemon()
    forks.guard(daemon, asyncio.get_running_loop())
    try:
        yield
    finally:
        forks.release(daemon)


def _copy_says(where: int) -> None:
    if os.getpid() != TEST_PID:  # a forked process got here: the fix failed
        os._exit(where)


def _status_of(pid: int) -> int:
    """The exit status of this process's child ``pid``, waited for ENDS_WITHIN_S."""
    deadline = time.monotonic() + ENDS_WITHIN_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked process {pid} still ran after "
                                 f"{ENDS_WITHIN_S:g}s")
        time.sleep(0.01)


def _forking_app(forked: list[int]) -> App:
    """Handlers that fork once; in the forked process each ends its call as named."""
    app = App("forks")

    def fork() -> bool:
        """True in the forked process."""
        pid = os.fork()
        if pid:
            forked.append(pid)
        return not pid

    @app.handler("returns", retry_attempts=2, retry_delay_s=0.0, retry_jitter_s=0.0)
    async def returns(body: bytes) -> None:
        fork()

    @app.handler("raises", retry_attempts=1)  # (a retry's wait would end it too)
    async def raises(body: bytes, ctx: MessageContext) -> None:
        if fork():
            raise RuntimeError("the forked process's error")

    @app.handler("awaits", retry_attempts=1)
    async def awaits(body: bytes) -> None:
        loop = asyncio.get_running_loop()  # (a forked process finds no running loop)
        if fork():
            await loop.create_future()  # nothing sets it: the loop runs the rest

    @app.handler("def", retry_attempts=2, retry_delay_s=0.0, retry_jitter_s=0.0)
    def in_thread(body: bytes) -> None:
        fork()

    @app.handler("to_thread", retry_attempts=1)
    async def to_thread(body: bytes) -> None:
        await asyncio.to_thread(fork)

    return app


async def _in_the_put(letter: DeadLetter) -> None:
    _copy_says(IN_THE_PUT)


def _message(namespace: str) -> Message:
    return Message("m1", StreamId(namespace, "k"), b"{}", token=SequenceToken(0, 1))


Build = Callable[[HandlerSpec, DeliveryStats, HandlerThreads], Callable[[Message], Awaitable[Any]]]


def _shipped(spec: HandlerSpec, stats: DeliveryStats, threads: HandlerThreads
             ) -> Callable[[Message], Awaitable[Any]]:
    chain = build_chain(spec, chain_interceptors(_in_the_put, stats), threads.run)
    return lambda msg: chain(Delivery(msg, spec))


def _runners(spec: HandlerSpec, stats: DeliveryStats, threads: HandlerThreads
             ) -> Callable[[Message], Awaitable[Any]]:
    """The shipped step as the agent's runner calls it (DirectCall.run)."""
    direct = direct_call(build_chain(spec, chain_interceptors(_in_the_put, stats),
                                     threads.run))
    assert direct is not None
    return direct.run


def _composed(spec: HandlerSpec, stats: DeliveryStats, threads: HandlerThreads
              ) -> Callable[[Message], Awaitable[Any]]:
    """Every step a frame of its own (as with an app interceptor, a pool, a cell)."""
    chain = compose(spec, chain_interceptors(_in_the_put, stats),
                    call_handler(spec, threads.run))
    return lambda msg: chain(Delivery(msg, spec))


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize("build", [_shipped, _runners, _composed])
@pytest.mark.parametrize("namespace", ["returns", "raises", "awaits", "def", "to_thread"])
async def test_a_forked_process_that_comes_back_from_its_handler_ends_there(
    build: Build, namespace: str,
) -> None:
    forked: list[int] = []
    [spec] = [s for s in _forking_app(forked).handlers if s.namespace == namespace]
    stats = DeliveryStats()
    threads = HandlerThreads(lambda: 4)
    try:
        await build(spec, stats, threads)(_message(namespace))
        _copy_says(PAST_THE_CALL)
    finally:
        threads.close()
    [pid] = forked
    assert _status_of(pid) == forks.COPY_STATUS
    # The parent's own call went on as ever: handled once, nothing failed.
    assert (stats.handled, stats.failed_attempts, stats.dead_lettered) == (1, 0, 0)


async def test_a_process_forked_while_no_daemon_runs_is_left_alone() -> None:
    """Not a copy of a worker (a daemon stopped; a program that never ran one): nothing
    ends it, it goes on as the program it is."""
    daemon = Daemon()
    forks.guard(daemon, asyncio.get_running_loop())
    forks.release(daemon)
    pid = os.fork()
    if not pid:
        os._exit(0 if not forks.copied else forks.COPY_STATUS)
    assert _status_of(pid) == 0


@pytest.mark.usefixtures("guarded")
async def test_a_def_handlers_forked_process_ends_before_its_thread_takes_a_lock() -> None:
    """A handler thread's lock may be held at the fork by another thread (the loop's,
    handing over a call): in the forked process, where only the forking thread lives
    on, it stays held for good. The process ends as its call returns, before its thread
    takes the lock — it would otherwise wait there for ever, an orphan."""
    threads = HandlerThreads(lambda: 4)
    held, let_go = threading.Event(), threading.Event()
    forked: list[int] = []

    def holder() -> None:
        with threads._lock:
            held.set()
            let_go.wait(ENDS_WITHIN_S)

    def handler() -> None:
        threading.Thread(target=holder, daemon=True).start()  # (taken once this runs)
        held.wait(ENDS_WITHIN_S)
        pid = os.fork()
        if pid:
            forked.append(pid)
            let_go.set()

    try:
        await threads.run(handler)
        _copy_says(PAST_THE_CALL)
    finally:
        let_go.set()
        threads.close()
    [pid] = forked
    assert _status_of(pid) == forks.COPY_STATUS
