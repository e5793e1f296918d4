"""The delivery chain's parts: the per-message :class:`Delivery`, steps, interceptors.

A *step* takes a :class:`Delivery` and returns an awaitable that finishes when the
rest of the chain has. An :class:`Interceptor` wraps the next step in one of its own
(:meth:`Interceptor.wrap`), once per handler, when a daemon subscribes; a message then
walks the prebuilt chain with no lookups. Steps need not be ``async def``: the decode
step and the handler call are plain functions returning the next awaitable, so they
cost no coroutine frame of their own.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import msgspec

from conveyor.platform import forks
from conveyor.platform.errors import (
    ConveyorError,
    DeliveryLimit,
    HandlerDeclarationError,
    error_text,
)
from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.platform.message import Message
from conveyor.platform.options import HandlerOptions


class Delivery(msgspec.Struct, gc=False):
    """One message on its way through one handler's chain (one per message and handler).

    ``body`` is the decoded body once the decode step has run. ``attempt`` is the
    number of the handler call under way: 0 until the body has decoded, 1 for the first
    call, 2 for the first retry ...; a retry also raises ``message.attempt`` (the wire's
    ``cv-attempt``: deliveries that failed before).

    **A batch** (a ``batch_size=N`` handler) is one delivery: ``batch`` holds its
    messages in queue order, ``message`` is the first of them and ``body`` the list of
    decoded bodies; None for a single message.
    Interceptors may read everything and keep their own state on themselves, not here.
    (A msgspec Struct: built per message, it costs a third of a slotted class.)
    """

    message: Message
    handler: HandlerSpec
    body: Any = None
    attempt: int = 0
    batch: list[Message] | None = None

    def context(self) -> MessageContext:
        """What a handler with a second parameter receives."""
        return MessageContext(self.message, self.handler.name)


Step = Callable[[Delivery], Awaitable[Any]]


class Interceptor:
    """One feature of delivery, wrapped around the rest of the chain.

    Subclass it and override :meth:`wrap`. Contract:

    * ``wrap(handler, next)`` runs once per handler when a daemon subscribes. Return a
      step that does your work around ``await next(delivery)``, or ``next`` itself to stay
      out of that handler's chain (an interceptor that is off costs nothing). Anything
      not callable is refused then (:class:`HandlerDeclarationError`).
    * App interceptors sit inside retry: your step runs once per *attempt*. Raising fails
      the attempt — the handler's retry policy retries it, then the message is
      dead-lettered with your exception. Returning without calling ``next`` skips the
      handler; the message counts as handled.
    * They wrap batch handlers too, once per call of the handler on a batch (each attempt,
      and each call of a bisection that looks for the failing messages): the delivery's
      ``batch`` lists the messages (see :class:`Delivery`). Raising fails that call.
    * A message is acknowledged only after every handler's chain has returned for it.
    * ``asyncio.CancelledError`` (the daemon stopping) must propagate. Never block the
      event loop.

    ``options`` names a :class:`~conveyor.platform.options.HandlerOptions` type whose
    keywords ``App.handler`` then accepts and validates at declaration; read the value
    with ``handler.option(YourOptions)``.
    """

    options: ClassVar[type[HandlerOptions] | None] = None

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        return next


InThread = Callable[..., Awaitable[Any]]
"""``in_thread(fn, *args)``: runs ``fn(*args)`` on a thread, in a copy of the caller's
``contextvars`` context (the current span with it), and returns an awaitable of its
result; cancelling the awaitable abandons the call (a thread cannot be interrupted).
A daemon passes its :class:`~conveyor.workers.threads.HandlerThreads`' ``run``;
:func:`asyncio.to_thread` is the default."""


class HandlerCancelled(ConveyorError):
    """A handler raised :class:`asyncio.CancelledError` though nothing cancelled its call:
    it awaited a task or future that was cancelled elsewhere, or raised it itself. To
    the agent a ``CancelledError`` means "stop" (the daemon stopping, the queue lost);
    left to propagate, this one ended the runner and left the message unfinished, its
    stream stuck behind it for good. It is a failure of the call like any other:
    retried by the handler's policy, then dead-lettered with this reason."""


class HandlerBaseException(ConveyorError):
    """A handler raised a ``BaseException`` that is not an ``Exception`` (a class of its
    own deriving from ``BaseException``): like :class:`HandlerCancelled`, a failure of
    the call — retried, then dead-lettered — rather than the end of the runner.
    ``KeyboardInterrupt`` and ``SystemExit`` are not caught: they stop the worker, and
    the message comes back to the next one as a redelivered message (counted, and
    dead-lettered after ``max_deliveries``)."""


STOPS = (KeyboardInterrupt, SystemExit)
"""What a handler may raise that is never taken for its failure: it stops the worker.

``GeneratorExit`` is not one: the only way it reaches a call's awaiter is a handler (or
a library it uses) raising it, since a coroutine is closed only when it is collected,
never while a task awaits it (the agent holds its runners' tasks; a call collected
while some other task runs would be taken for a failure, and then complain that it
ignored GeneratorExit) — so it is the call's failure like any other
``BaseException`` (:func:`as_failure`). Raised again, it ended the runner and left its
message unfinished, holding up its queue's acknowledgements until a restart."""


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no running loop
        return False


def as_failure(exc: BaseException) -> ConveyorError:
    """``exc``, a ``BaseException`` a handler's call raised, as that call's failure — or
    raised again when it must propagate: the task running the call is itself being
    cancelled (a stop, a lost queue), or it is one of :data:`STOPS`."""
    if isinstance(exc, STOPS) or (isinstance(exc, GeneratorExit) and not _in_task()):
        raise exc  # (GeneratorExit with no task running: a coroutine really closed)
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise exc
        return stray_cancel_failure()
    return base_exception_failure(exc)


def stray_cancel_failure() -> HandlerCancelled:
    """A call's failure by a ``CancelledError`` nothing sent to the task running it."""
    return HandlerCancelled(
        "the handler raised CancelledError though its call was not cancelled (it "
        "awaited a task or future cancelled elsewhere, or raised it itself)")


def base_exception_failure(exc: BaseException) -> HandlerBaseException:
    """A call's failure by ``exc``, a ``BaseException`` that is not an ``Exception``."""
    return HandlerBaseException(
        f"the handler raised {error_text(exc)} (a BaseException, not an "
        "Exception)")


T = TypeVar("T")


class _FailsOnGeneratorExit:
    """``coro`` as a task drives it, except that a ``GeneratorExit`` thrown into it is
    thrown in as the call's failure (:func:`base_exception_failure`).

    A task throws into its coroutine the exception of the future it awaited; a future
    holds ``GeneratorExit`` when a handler awaits one that it ended (``await
    asyncio.to_thread(fn)``, ``fn`` raising it). Thrown in as itself, Python closes
    every coroutine the task's awaits through (a coroutine awaiting another cannot be
    thrown ``GeneratorExit``) and raises it in the outermost: the handler's frame ended
    where it stood, the delivery chain's with it, and the runner crashed with its
    message unfinished. Thrown in as a failure, it is raised where the handler awaited,
    as any exception a future holds: the handler may catch it, or its call fails, is
    retried and dead-lettered with the reason.

    ``send`` and ``close`` are ``coro``'s own (bound C methods): a task's steps cost no
    Python frame more. Not a subclass of :class:`collections.abc.Coroutine`, which would
    need methods of the class's own in their place: registered as one instead.
    """

    send: Callable[[Any], Any]
    close: Callable[[], None]

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.send = coro.send
        self.close = coro.close

    def throw(self, exc: Any, *rest: Any) -> Any:
        if isinstance(exc, GeneratorExit):
            failure = base_exception_failure(exc)
            failure.__cause__ = exc
            return self._coro.throw(failure)
        return self._coro.throw(exc, *rest)

    def __await__(self) -> Any:
        return self._coro.__await__()

    def __repr__(self) -> str:
        return repr(self._coro)


collections.abc.Coroutine.register(_FailsOnGeneratorExit)


def handler_task(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """A task for ``coro``, which runs handlers' calls: a ``GeneratorExit`` a handler's
    awaited future holds is that call's failure, not the end of the task
    (:class:`_FailsOnGeneratorExit`)."""
    guarded = cast(Coroutine[Any, Any, T], _FailsOnGeneratorExit(coro))
    return asyncio.get_running_loop().create_task(guarded, name=name)


def handler_call(handler: HandlerSpec, in_thread: InThread | None = None
                 ) -> Callable[..., Awaitable[Any]]:
    """``handler``'s function as something to await: itself for an ``async def``, a call
    through ``in_thread`` for a plain ``def``. Decided once, when a chain is built."""
    if not handler.sync:
        fn: Callable[..., Awaitable[Any]] = handler.fn
        return fn
    return functools.partial(in_thread or asyncio.to_thread, handler.fn)


def check_returned(result: object) -> None:
    """What a handler returned, when not None: a coroutine it returned instead of
    awaiting (``return save(x)`` where ``return await save(x)`` was meant) never ran, so
    the call fails — retried, then dead-lettered — rather than counting as handled with
    its work lost. The coroutine is closed (no "never awaited" warning). So does a
    generator or async generator it returns (a generator function wrapped in a plain
    one, whose ``yield`` its declaration could not see): its body never ran. Anything
    else a handler returns is ignored, as before. (A plain ``def`` handler returning a
    coroutine is caught on its thread: :mod:`conveyor.workers.threads`.)"""
    if inspect.iscoroutine(result):
        name = getattr(result, "__qualname__", type(result).__name__)
        result.close()
        raise HandlerDeclarationError(
            f"the handler returned the coroutine {name}() without awaiting it, so it never "
            "ran (`return f(...)` where `return await f(...)` was meant?)")
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        kind = "generator" if inspect.isgenerator(result) else "async generator"
        raise HandlerDeclarationError(
            f"the handler returned the {kind} {result.__qualname__}() without iterating "
            "it, so it never ran (a handler's work runs in the call: drop the `yield`)")


def call_handler(handler: HandlerSpec, in_thread: InThread | None = None) -> Step:
    """The innermost step: the handler itself, on the decoded body (a plain ``def``
    handler through ``in_thread``, see :func:`handler_call`), what it returns checked by
    :func:`check_returned`. (The shipped chain's first attempt calls the handler in
    :meth:`~conveyor.platform.delivery.dead_letter.DeadLetterInterceptor.first_attempt`
    or the agent's runner instead, which check the same.)

    A process the handler forked that comes back here ends (:mod:`~conveyor.platform.
    forks`), as in every place that awaits a handler's call."""
    fn = handler_call(handler, in_thread)
    if handler.takes_context:
        async def called_with_context(delivery: Delivery) -> Any:
            try:
                result = await fn(delivery.body, delivery.context())
            finally:
                if forks.copied:
                    forks.end_copy()
            if result is not None:
                check_returned(result)
            return result

        return called_with_context

    async def called(delivery: Delivery) -> Any:
        try:
            result = await fn(delivery.body)
        finally:
            if forks.copied:
                forks.end_copy()
        if result is not None:
            check_returned(result)
        return result

    return called


class Decode(Interceptor):
    """Decode the body once, before any attempt: a body that does not decode is never
    retried (the dead-letter step stores it with ``attempts=0``).

    First, the delivery limit: a message delivered more than the handler's
    ``max_deliveries`` times is not run again (:class:`DeliveryLimit`, dead-lettered with
    ``attempts=0``).
    """

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        decode = handler.decode
        limit = handler.retry.max_deliveries

        def decoded(delivery: Delivery) -> Awaitable[Any]:
            if delivery.message.deliveries > limit:
                raise _over_limit(delivery.message, limit)
            delivery.body = decode(delivery.message)
            delivery.attempt = 1
            return next(delivery)

        return decoded


def over_limit(msg: Message, limit: int) -> DeliveryLimit:
    """The error of a message delivered more than ``limit`` times (see :class:`Decode`)."""
    return _over_limit(msg, limit)


def _over_limit(msg: Message, limit: int) -> DeliveryLimit:
    why = (f"last time, {msg.last_cause}" if msg.last_cause else
           "each time, the worker holding it stopped before it was done — it crashed, was "
           "killed, or blocked its event loop past the lease (the workers' logs name the "
           "handler and message of a stall)")
    return DeliveryLimit(
        f"delivered {msg.deliveries} times without finishing (max_deliveries = {limit}): "
        f"{why}")


def compose(handler: HandlerSpec, interceptors: Sequence[Interceptor], innermost: Step) -> Step:
    """``interceptors[0]`` outermost, ``innermost`` last."""
    step = innermost
    for interceptor in reversed(interceptors):
        step = wrapped(interceptor, handler, step)
    return step


def wrapped(interceptor: Interceptor, handler: HandlerSpec, next: Step) -> Step:
    """``interceptor.wrap(handler, next)``, refused (:class:`HandlerDeclarationError`,
    when the daemon subscribes) unless it is callable: a ``wrap`` that forgot its
    ``return`` would otherwise fail every attempt of every message, each retried and
    dead-lettered with ``'NoneType' object is not callable``."""
    step = interceptor.wrap(handler, next)
    if not callable(step):
        raise HandlerDeclarationError(
            f"{type(interceptor).__qualname__}.wrap returned {step!r:.80} for handler "
            f"{handler.name!r}: it must return a step (an async callable) or `next`")
    return step


@dataclass(slots=True)
class DeliveryStats:
    """Plain counters, read by metrics exporters and status; cheap enough for the hot path.

    ``handled`` and ``dead_lettered`` count deliveries (message x handler); ``failed``
    counts handler calls that raised; ``retried`` the calls made after a failure;
    ``skipped`` messages of a namespace no handler of the app subscribes to that were
    acknowledged without a dead letter (``[dead_letters] unroutable = "skip"``);
    ``dead_letters_evicted`` older letters a ``[dead_letters] max_entries`` bound evicted;
    ``deduplicated`` deliveries an ``idempotent=True`` handler had already completed.
    """

    handled: int = 0
    retried: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    dead_letters_evicted: int = 0
    deduplicated: int = 0
