"""A handler that raises ``asyncio.CancelledError`` though nothing cancelled its call —
it awaited a task or future cancelled elsewhere, or raised it itself — fails that call
like any other exception: retried, then dead-lettered with the reason, and its stream's
later messages run. (It used to end the agent's runner: the message stayed unfinished
and its stream stuck behind it, silently, for good.) So does a ``BaseException`` class
of the handler's own, and ``GeneratorExit`` raised by one. A real stop still cancels."""

from __future__ import annotations

import asyncio
import sys

import pytest

from conveyor import App, Client, MessageContext
from conveyor.testing import TestWorker
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter
from tests.integration.one_poison import Passing, settle_one_poison

N = 6
POISON = 2  # stream "k": messages 3..5 wait behind it


async def _cancelled_elsewhere() -> None:
    """What a handler meets when it awaits a task that another task cancelled."""
    task = asyncio.ensure_future(asyncio.sleep(10))
    task.cancel()
    await task


def _raise_generator_exit() -> None:
    raise GeneratorExit("closed in a thread")


class Abort(BaseException):
    """A handler's own BaseException, not an Exception."""


def _app(name: str, interceptor: bool, raising: str = "cancelled"
         ) -> tuple[App, list[int], str]:
    app = App(name, interceptors=[Passing()] if interceptor else [])
    calls: list[int] = []

    @app.handler("items", retry_attempts=2)
    async def handle(item: dict[str, int], ctx: MessageContext) -> None:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            if raising == "cancelled":
                await _cancelled_elsewhere()
            if raising == "generator-exit":
                raise GeneratorExit("closed by hand")
            if raising == "awaited-generator-exit":
                await asyncio.to_thread(_raise_generator_exit)
            raise Abort("gave up")

    reason = {"cancelled": "CancelledError though its call was not cancelled",
              "abort": "the handler raised Abort: gave up",
              "generator-exit": "the handler raised GeneratorExit: closed by hand",
              "awaited-generator-exit": "the handler raised GeneratorExit: closed in a thread",
              }[raising]
    return app, calls, reason


async def _check(app: App, calls: list[int], reason: str) -> None:
    letter, handled = await settle_one_poison(app, N)
    assert letter.body == {"seq": POISON}
    assert letter.letter is not None and letter.letter.attempts == 2
    assert reason in letter.letter.error
    # Every message ran, in order; only the poison one twice (its two attempts).
    assert calls == [0, 1, POISON, POISON, 3, 4, 5]
    assert handled == [0, 1, 3, 4, 5]


async def test_on_the_shipped_chain_it_is_retried_then_dead_lettered() -> None:
    await _check(*_app("cancelled-shipped", interceptor=False))


async def test_through_an_app_interceptor_it_is_retried_then_dead_lettered() -> None:
    await _check(*_app("cancelled-chain", interceptor=True))


async def test_a_base_exception_of_the_handler_s_own_is_retried_then_dead_lettered() -> None:
    await _check(*_app("abort-shipped", interceptor=False, raising="abort"))


async def test_generator_exit_raised_by_a_handler_is_retried_then_dead_lettered() -> None:
    # It was taken for the runner's coroutine being closed and raised again: the runner
    # ended ("runner crashed"), its message stayed unfinished and the queue's
    # acknowledgements stopped behind it until a restart.
    await _check(*_app("generator-exit-shipped", interceptor=False, raising="generator-exit"))
    await _check(*_app("generator-exit-chain", interceptor=True, raising="generator-exit"))


async def test_generator_exit_of_a_future_a_handler_awaits_is_retried_then_dead_lettered(
) -> None:
    # A future holding it (asyncio.to_thread of a function that raised it) has the
    # task throw it into the runner's coroutine: Python closes the coroutines that one
    # awaits (the handler's, the chain's) and raises it in the runner. Through an
    # interceptor the runner ended ("an agent task crashed (GeneratorExit)") and the
    # daemon failed with its message unfinished; on the shipped chain the handler's
    # frame was closed before it could catch anything.
    await _check(*_app("awaited-exit-shipped", interceptor=False,
                       raising="awaited-generator-exit"))
    await _check(*_app("awaited-exit-chain", interceptor=True,
                       raising="awaited-generator-exit"))


@pytest.mark.parametrize("kind", ["stateless", "cells"])
async def test_generator_exit_of_an_awaited_future_in_a_pool_or_cell_is_its_call_s_failure(
    kind: str,
) -> None:
    # A pool's or a cell's worker runs the call in a task of its own, into which the
    # future's GeneratorExit was thrown: the pool handed it on to the runner, which
    # crashed; the cell's worker ended, its call's future never done (the stream waited
    # for ever).
    app = App(f"awaited-exit-{kind}")
    calls: list[int] = []
    options = {"stateless": {"stateless": True, "max_workers": 2},
               "cells": {"cell_key": "body:seq", "cell_size": 1}}[kind]

    @app.handler("items", retry_attempts=2, **options)
    async def handle(item: dict[str, int]) -> None:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            await asyncio.to_thread(_raise_generator_exit)

    await _check(app, calls, "the handler raised GeneratorExit: closed in a thread")


@pytest.mark.parametrize("batch", [False, True])
async def test_generator_exit_raised_by_a_def_handler_is_retried_then_dead_lettered(
    batch: bool,
) -> None:
    # On a handler thread it reached the awaiting task through a future, which throws it
    # into the runner's coroutine: Python then closes the coroutines it awaits and raises
    # it in the runner, which ended ("an agent task crashed (GeneratorExit)"), and the
    # daemon failed with its message unfinished.
    app = App("generator-exit-def")
    calls: list[int] = []

    def handle(item: dict[str, int]) -> None:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            raise GeneratorExit("closed by hand")

    def handle_batch(items: list[dict[str, int]]) -> None:
        for item in items:
            handle(item)

    if batch:
        app.handler("items", retry_attempts=2, batch_size=1)(handle_batch)
    else:
        app.handler("items", retry_attempts=2)(handle)
    await _check(app, calls, "the handler raised GeneratorExit: closed by hand")


async def test_a_batch_handler_that_raises_it_fails_its_batch_and_the_rest_run() -> None:
    app = App("cancelled-batch")
    seen: list[int] = []

    @app.handler("items", batch_size=3, batch_wait_ms=50, retry_attempts=1)
    async def handle(items: list[dict[str, int]]) -> None:
        seqs = [i["seq"] for i in items]
        if POISON in seqs:
            await _cancelled_elsewhere()
        seen.extend(seqs)

    async with TestWorker(app, settle_timeout_s=10.0) as worker:
        for seq in range(N):
            await worker.publish("items", f"k{seq}", {"seq": seq})
        await worker.settle(raise_on_dead_letters=False)
        [letter] = worker.dead_lettered("items")
        assert letter.body == {"seq": POISON}
        assert sorted(seen) == [s for s in range(N) if s != POISON]


async def test_a_stop_still_cancels_a_handler_that_waits() -> None:
    app = App("cancelled-stop")
    started = asyncio.Event()
    ended: list[str] = []

    @app.handler("items")
    async def handle(item: dict[str, int]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    worker = TestWorker(app, settle_timeout_s=10.0)
    await worker.start()
    await worker.publish("items", "k", {"seq": 0})
    await asyncio.wait_for(started.wait(), 5)
    async with asyncio.timeout(10):
        await worker.stop()
    assert ended == ["cancelled"]
    assert worker.dead_lettered("items") == []


class Unprintable(Exception):
    """An exception whose ``str()`` raises (a buggy ``__str__``)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


async def test_an_exception_whose_str_raises_is_dead_lettered_and_the_stream_flows_on() -> None:
    # Its letter's text used to be str(exc), which raised in the runner: the runner
    # ended ("runner crashed"), the message stayed unfinished and its stream stuck.
    app = App("unprintable")
    calls: list[int] = []

    @app.handler("items", retry_attempts=2)
    async def handle(item: dict[str, int]) -> None:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            raise Unprintable()

    await _check(app, calls, "<str() of the error failed: RuntimeError>")


async def test_a_def_handler_that_raises_stop_iteration_is_dead_lettered_and_the_stream_flows_on(
) -> None:
    # A Future refuses StopIteration (TypeError in the loop's callback): the call never
    # returned, holding its slot and its stream, until the drain abandoned it.
    app = App("stop-iteration")
    calls: list[int] = []

    @app.handler("items", retry_attempts=2)
    def handle(item: dict[str, int]) -> None:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            raise StopIteration

    await _check(app, calls, "raised StopIteration")


KINDS = {"plain": {}, "stateless": {"stateless": True, "max_workers": 2},
         "cells": {"cell_key": "header:tenant", "cell_size": 1},
         "batch": {"batch_size": 5, "batch_wait_ms": 10}}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_stop_ends_though_a_handler_swallowed_its_cancel_and_returned(
        kind: str) -> None:
    """A handler written with a bare ``except:`` catches the stop's ``CancelledError``
    and returns. The task that ran it (the agent's runner, a pool's or a cell's worker,
    a batcher) then waited for more work still owing the cancel, and the daemon's stop
    waited for it for ever (``conveyor worker`` left after drain_timeout_s + 3 s;
    ``daemon.stop()`` in an embedding never returned). They honour the cancel their
    handler swallowed: the stop ends, and every message was handled (the swallowing
    call's too: it returned)."""
    app = App(f"swallowed-{kind}")
    started = asyncio.Event()
    handled: list[int] = []
    interrupted: list[str] = []

    async def work(item: dict[str, int]) -> None:
        if item["seq"] == 0:
            started.set()
            try:
                await asyncio.sleep(30)
            except:  # noqa: E722 — as people write them
                interrupted.append(repr(sys.exc_info()[1]))
        handled.append(item["seq"])

    if kind == "batch":
        @app.handler("items", **KINDS[kind])
        async def batch(items: list[dict[str, int]]) -> None:
            for item in items:
                await work(item)
    else:
        app.handler("items", **KINDS[kind])(work)

    adapter = fresh_adapter()
    cfg = config(worker={"drain_timeout_s": 0.3})
    d = daemon(app, adapter, cfg)
    client = Client(adapter, d.mapper)
    await d.start()
    await client.publish("items", "k0", {"seq": 0}, headers={"tenant": "t0"})
    await asyncio.wait_for(started.wait(), 5)
    # Other streams (and cells) run beside the stuck call. (A batcher runs one batch at
    # a time, and one holding messages ends at the stop anyway: the batch case has none.)
    others = range(1, 5) if kind != "batch" else range(1, 1)
    for seq in others:
        await client.publish("items", f"k{seq}", {"seq": seq}, headers={"tenant": f"t{seq}"})
    await wait_until(lambda: len(handled) == len(others), 5, what="the others handled")
    async with asyncio.timeout(5):  # without the fix: for ever
        await d.stop()
    assert sorted(handled) == [0, *others]  # each once, the swallowing call's too
    assert interrupted == ["CancelledError()"]  # by the stop, once


async def _fails_late() -> None:
    await asyncio.sleep(0.01)
    raise ValueError("a child failed after the TaskGroup's body ended")


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_taskgroup_child_failing_late_leaves_the_worker_taking_messages(
        kind: str) -> None:
    """Python 3.11's ``TaskGroup`` leaves its parent task's ``cancelling()`` at 1 when a
    child fails after the body has ended (CPython gh-116720): the usual way to use one.
    The handler runs in the worker's task, which then counts a cancel nobody asked for;
    honoured as a swallowed stop's, it ended a pool's or a cell's worker for good (the
    calls given to it waited for ever) and a batcher with messages still held. The
    worker goes on: every message handled once, in order (one stream, one tenant)."""
    app = App(f"taskgroup-{kind}")
    handled: list[int] = []
    late: list[int] = []

    async def work(item: dict[str, int]) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_fails_late())
        except* ValueError:
            late.append(item["seq"])  # the child failed after the body: the 3.11 case
        handled.append(item["seq"])

    options = {**KINDS[kind], "batch_size": 1} if kind == "batch" else KINDS[kind]
    if kind == "batch":
        @app.handler("items", **options)
        async def batch(items: list[dict[str, int]]) -> None:
            for item in items:
                await work(item)
    else:
        app.handler("items", **options)(work)

    adapter = fresh_adapter()
    d = daemon(app, adapter, config(worker={"drain_timeout_s": 0.3}))
    client = Client(adapter, d.mapper)
    await d.start()
    try:
        for seq in range(4):
            await client.publish("items", "k", {"seq": seq}, headers={"tenant": "t"})
        await wait_until(lambda: len(handled) == 4, 5, what="the 4 messages handled")
        assert handled == [0, 1, 2, 3] and late == handled
    finally:
        async with asyncio.timeout(5):
            await d.stop()
