"""The shipped chain's shortcut (build_chain -> DeadLetterInterceptor.first_attempt) does
exactly what the dead-letter, decode and retry steps composed one around the other do."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from conveyor.platform.app import App
from conveyor.platform.delivery import (
    Delivery,
    DeliveryStats,
    Interceptor,
    Step,
    build_chain,
    chain_interceptors,
)
from conveyor.platform.delivery.chain import call_handler, compose
from conveyor.platform.delivery.dead_letter import direct_call
from conveyor.platform.delivery.metrics import HandlerDuration
from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.platform.histograms import LocalMetrics
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.telemetry import DESTINATION


class Order(msgspec.Struct):
    n: int


def _app() -> tuple[App, dict[str, list[Any]]]:
    app = App("shortcut")
    seen: dict[str, list[Any]] = {"flaky": [], "ctx": [], "sync": []}

    @app.handler("ok", retry_delay_s=0.0, retry_jitter_s=0.0)
    async def ok(body: Order) -> None:
        return None

    @app.handler("flaky", retry_delay_s=0.0, retry_jitter_s=0.0)
    async def flaky(body: Order, ctx: MessageContext) -> None:
        seen["flaky"].append((body.n, ctx.attempt))
        if ctx.attempt < 2:
            raise ValueError(f"attempt {ctx.attempt}")

    @app.handler("broken", retry_attempts=2, retry_delay_s=0.0, retry_jitter_s=0.0)
    async def broken(body: Order) -> None:
        raise RuntimeError(f"always {body.n}")

    @app.handler("once", retry_attempts=1)
    async def once(body: bytes) -> None:
        raise KeyError("no retry")

    @app.handler("ctx", max_deliveries=2)
    async def with_ctx(body: bytes, ctx: MessageContext) -> None:
        seen["ctx"].append((body, ctx.deliveries))

    @app.handler("sync", retry_delay_s=0.0, retry_jitter_s=0.0)
    def blocking(body: str) -> None:
        seen["sync"].append(body)
        if len(seen["sync"]) == 1:
            raise OSError("first call fails")

    @app.handler("stray", retry_attempts=2, retry_delay_s=0.0, retry_jitter_s=0.0)
    async def stray(body: bytes) -> None:
        task = asyncio.ensure_future(asyncio.sleep(10))
        task.cancel()
        await task  # CancelledError, though nothing cancelled this call

    @app.handler("stray1", retry_attempts=1)
    async def stray_once(body: bytes) -> None:
        raise asyncio.CancelledError

    @app.handler("odd", retry_attempts=2, retry_delay_s=0.0, retry_jitter_s=0.0)
    async def odd(body: bytes) -> None:
        raise Odd("not an Exception")

    return app, seen


class Odd(BaseException):
    """A handler's own BaseException (not an Exception)."""


def _message(namespace: str, body: bytes, deliveries: int = 1) -> Message:
    return Message("m1", StreamId(namespace, "k"), body, token=SequenceToken(0, 1),
                   deliveries=deliveries)


CASES = [
    ("ok", b'{"n": 1}', 1),
    ("ok", b"not json", 1),  # undecodable: attempts=0, never retried
    ("ok", b'{"n": 1}', 6),  # past max_deliveries
    ("flaky", b'{"n": 2}', 1),  # fails once, retried, handled
    ("broken", b'{"n": 3}', 1),  # every attempt fails: dead letter, attempts=2
    ("once", b"x", 1),  # retry off
    ("ctx", b"y", 2),
    ("ctx", b"y", 3),  # past max_deliveries=2
    ("sync", b"z", 1),  # a plain def on a thread, retried once
    ("stray", b"s", 1),  # CancelledError not from a cancel: retried, then a letter
    ("stray1", b"s", 1),  # the same with retry off
    ("odd", b"o", 1),  # a BaseException of the handler's own: retried, then a letter
]


async def _run(build: Any) -> tuple[DeliveryStats, list[tuple[str, str, str, int]], Any]:
    app, seen = _app()
    stats = DeliveryStats()
    letters: list[DeadLetter] = []

    async def put(letter: DeadLetter) -> None:
        letters.append(letter)

    interceptors = chain_interceptors(put, stats)
    chains = {spec.namespace: (spec, build(spec, interceptors)) for spec in app.handlers}
    for namespace, body, deliveries in CASES:
        spec, chain = chains[namespace]
        await chain(Delivery(_message(namespace, body, deliveries), spec))
    return stats, [(x.handler, x.error_type, x.error, x.attempts) for x in letters], seen


def _composed(spec: HandlerSpec, interceptors: list[Interceptor]) -> Step:
    return compose(spec, interceptors, call_handler(spec))


def test_the_shortcut_counts_retries_and_dead_letters_as_the_composed_steps_do() -> None:
    shortcut = asyncio.run(_run(build_chain))
    composed = asyncio.run(_run(_composed))
    assert shortcut == composed
    stats, letters, seen = shortcut
    assert stats.handled == 4 and stats.dead_lettered == 0  # the store counts, not put
    assert [attempts for *_, attempts in letters] == [0, 0, 2, 1, 0, 2, 1, 2]
    assert [error_type for _, error_type, *_ in letters[-3:]] == [
        "HandlerCancelled", "HandlerCancelled", "HandlerBaseException"]
    assert seen["flaky"] == [(2, 0), (2, 1), (2, 2)]
    assert seen["ctx"] == [(b"y", 2)]


async def _discard(letter: DeadLetter) -> None:
    return None


class _Tag(Interceptor):
    """An app interceptor that is on: it passes the delivery on."""

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        async def tagged(delivery: Delivery) -> Any:
            return await next(delivery)
        return tagged


def _direct(spec: HandlerSpec, interceptors: list[Interceptor]) -> Step:
    """The chain as the agent's runner calls it: its DirectCall's two parts."""
    direct = direct_call(build_chain(spec, interceptors))
    assert direct is not None

    async def run(delivery: Delivery) -> None:
        await direct.run(delivery.message)

    return run


def test_the_runners_direct_call_counts_retries_and_dead_letters_as_the_steps_do() -> None:
    """The runner calls the shipped step in two parts (DirectCall: start, then finish on
    a failure), with no Delivery unless the call fails: the same handler calls, counts
    and letters (attempts 0 for a body that does not decode or a delivery past the
    limit, then the retries) as the composed steps."""
    assert asyncio.run(_run(_direct)) == asyncio.run(_run(_composed))


def test_the_direct_call_is_offered_only_for_the_one_step() -> None:
    app, _ = _app()
    spec = app.handlers[0]
    put = _discard
    shipped = direct_call(build_chain(spec, chain_interceptors(put, DeliveryStats())))
    assert shipped is not None and shipped.record is None
    assert direct_call(build_chain(spec, chain_interceptors(put, DeliveryStats(),
                                                            app=[_Tag()]))) is None
    metered = chain_interceptors(put, DeliveryStats(), metrics=LocalMetrics("test"))
    assert isinstance(metered[0], HandlerDuration)
    timed = direct_call(build_chain(spec, metered))  # timed inside the step, as before
    assert timed is not None and timed.record is not None


@pytest.mark.parametrize("build", [build_chain, _direct])
def test_with_metrics_on_each_delivery_is_timed_once_however_the_step_is_called(
        build: Any) -> None:
    """The runner's direct call times what the step timed: every delivery once, handled
    or dead-lettered, into the handler's series of the duration histogram."""
    app, _ = _app()
    local = LocalMetrics("test")
    interceptors = chain_interceptors(_discard, DeliveryStats(), metrics=local)
    chains = {spec.namespace: (spec, build(spec, interceptors)) for spec in app.handlers}

    async def main() -> None:
        for namespace, body, deliveries in CASES:
            spec, chain = chains[namespace]
            await chain(Delivery(_message(namespace, body, deliveries), spec))

    asyncio.run(main())
    (family,) = local.families
    family.fold()
    per_handler = {s.attributes[DESTINATION]: sum(s.counts) for s in family.all_series()}
    expected: dict[str, int] = {}
    for namespace, *_ in CASES:
        expected[namespace] = expected.get(namespace, 0) + 1
    assert per_handler == expected


def test_the_shortcut_is_taken_only_when_nothing_else_is_on_inside_the_dead_letter_step(
) -> None:
    app, _ = _app()
    spec = app.handlers[0]

    put, Tag = _discard, _Tag

    class Off(Interceptor):
        """An interceptor of the app's that changes nothing (its wrap is the base's)."""

    shipped = build_chain(spec, chain_interceptors(put, DeliveryStats(), app=[Off()]))
    with_app = build_chain(spec, chain_interceptors(put, DeliveryStats(), app=[Tag()]))
    assert shipped.__qualname__.startswith("DeadLetterInterceptor.first_attempt")
    assert with_app.__qualname__.startswith("DeadLetterInterceptor.wrap")


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("takes_context", [False, True])
def test_a_cancelled_handler_call_propagates_through_the_shortcut(takes_context: bool,
                                                                   direct: bool) -> None:
    app = App("cancel")
    if takes_context:
        @app.handler("c")
        async def slow_ctx(body: bytes, ctx: MessageContext) -> None:
            await asyncio.sleep(10)
    else:
        @app.handler("c")
        async def slow(body: bytes) -> None:
            await asyncio.sleep(10)
    spec = app.handlers[0]
    letters: list[DeadLetter] = []

    async def put(letter: DeadLetter) -> None:
        letters.append(letter)

    async def main() -> None:
        chain = (_direct if direct else build_chain)(spec, chain_interceptors(put, DeliveryStats()))
        task = asyncio.create_task(chain(Delivery(_message("c", b"x"), spec)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert letters == []


@pytest.mark.parametrize("build", [build_chain, _composed, _direct])
def test_system_exit_from_a_handler_is_not_taken_for_its_failure(build: Any) -> None:
    """SystemExit (and KeyboardInterrupt) stop the worker: never retried, never a letter;
    the message comes back to the next worker as a redelivered one."""
    app = App("exits")
    letters: list[DeadLetter] = []

    @app.handler("x", retry_delay_s=0.0, retry_jitter_s=0.0)
    async def leave(body: bytes) -> None:
        raise SystemExit(3)

    async def put(letter: DeadLetter) -> None:
        letters.append(letter)

    [spec] = app.handlers
    chain = build(spec, chain_interceptors(put, DeliveryStats()))
    with pytest.raises(SystemExit):
        asyncio.run(chain(Delivery(_message("x", b"x"), spec)))
    assert letters == []
