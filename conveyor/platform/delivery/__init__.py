"""The delivery chain: the whole path of one message through one handler, in one list.

When a daemon subscribes, it builds one chain per handler, outermost first::

    1. ConsumerSpans         tracing.py      the `process <ns>` span        (tracing on)
    2. HandlerDuration       metrics.py      the duration histogram, counted
                                             locally                        (metrics on)
    3. DeadLetterInterceptor dead_letter.py  nothing raised passes it: a failure is
                                             stored as a dead letter, then acked
    4. Decode                chain.py        the body, decoded once; a failure is not
                                             retried (dead letter, attempts=0)
    4½ IdempotencyInterceptor idempotency.py an id completed already is not run again;
                                             one delivery of an id at a time
                                             (``idempotent=True`` handlers only)
    5. RetryInterceptor      retry.py        attempts per the handler's RetryPolicy
                                             (absent when retry_attempts=1)
    6. RetrySpans            tracing.py      a `retry <handler>` span per retry (tracing on)
    7. the app's interceptors, in the order given to ``App(interceptors=...)``
    8. PoolInterceptor       workers/pools/interceptor.py   the call runs on the handler's
       or CellInterceptor    workers/cells/interceptor.py   pool or in its tenant's cell
    9. the handler           chain.py (call_handler); a plain ``def`` handler on a
                             thread of workers/threads.py, holding its slot meanwhile

An interceptor that is off is not in the chain: with telemetry off and no pool, cell
or app interceptor, a message walks steps 3, 4, 5 and 9 — built as one step that does
what the four do (see :func:`build_chain`), which the agent's runner calls in parts
(:class:`~conveyor.platform.delivery.dead_letter.DirectCall`). The agent hands a
message to each of its handlers' chains (through the queue cache's lanes) and
acknowledges it when every chain has returned. A batch handler (``batch_size=N``) has
no per-message chain: its batches go through the batch step (batch.py: decode, retry,
bisection, dead letters), which calls the handler through steps 7-9 — the app's
interceptors see one delivery per call, whose ``batch`` lists the messages. Messages
no handler takes never enter a chain: the agent stores them as dead letters
(undecodable entries, and unroutable ones when so configured) or skips them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry.trace import Tracer

from conveyor.platform.delivery.chain import (
    Decode,
    Delivery,
    DeliveryStats,
    Interceptor,
    InThread,
    Step,
    call_handler,
    compose,
    handler_call,
)
from conveyor.platform.delivery.dead_letter import (
    DeadLetterInterceptor,
    DeadLetterStore,
    PutLetter,
)
from conveyor.platform.delivery.metrics import HandlerDuration
from conveyor.platform.delivery.retry import RetryInterceptor
from conveyor.platform.handlers import HandlerSpec

if TYPE_CHECKING:
    from conveyor.platform.histograms import LocalMetrics

__all__ = [
    "DeadLetterInterceptor",
    "DeadLetterStore",
    "Delivery",
    "DeliveryStats",
    "InThread",
    "Interceptor",
    "PutLetter",
    "Step",
    "build_chain",
    "chain_interceptors",
]


def chain_interceptors(
    put_letter: PutLetter,
    stats: DeliveryStats,
    *,
    tracer: Tracer | None = None,
    metrics: LocalMetrics | None = None,
    system: str = "",
    group: str = "",
    app: Sequence[Interceptor] = (),
    hosting: Sequence[Interceptor] = (),
    idempotency: Interceptor | None = None,
) -> list[Interceptor]:
    """The interceptors of every chain of a daemon, outermost first (see above).

    With a tracer, ``put_letter`` should be the traced one
    (:func:`~conveyor.platform.delivery.tracing.traced_dead_letters`), as the agent's.
    ``metrics``: where the duration histogram is counted (a meter's
    :attr:`~conveyor.platform.telemetry.Telemetry.local`); None: no metrics step.
    """
    from conveyor.platform.delivery.tracing import ConsumerSpans, RetrySpans

    outer: list[Interceptor] = []
    inner: list[Interceptor] = []
    if tracer is not None:
        outer.append(ConsumerSpans(tracer, system=system, group=group))
        inner.append(RetrySpans(tracer))
    if metrics is not None:
        outer.append(HandlerDuration(metrics))
    return [
        *outer,
        DeadLetterInterceptor(put_letter, stats),
        Decode(),
        *([idempotency] if idempotency is not None else []),
        RetryInterceptor(),
        *inner,
        *app,
        *hosting,
    ]


def build_chain(handler: HandlerSpec, interceptors: Sequence[Interceptor],
                in_thread: InThread | None = None) -> Step:
    """The chain of ``handler``: ``interceptors`` (outermost first) around the handler;
    a plain ``def`` handler is called through ``in_thread`` (see :data:`InThread`).

    One shortcut, exact in what it does: where, for this handler, nothing is on inside
    the dead-letter step but :class:`Decode` and :class:`RetryInterceptor` (in that
    order; retry may be off) — the shipped chain without app interceptors, pool, cell or
    idempotency — those steps and the handler call are one step
    (:meth:`DeadLetterInterceptor.first_attempt`): two frames and two calls less a
    message (about 0.2 µs measured on the no-op benchmark). With metrics on, the
    :class:`~conveyor.platform.delivery.metrics.HandlerDuration` just outside it times
    the deliveries inside that step too (:meth:`HandlerDuration.timer`), a coroutine
    frame less again. Each interceptor's ``wrap`` still runs once (but that fused
    ``HandlerDuration``'s)."""
    innermost = call_handler(handler, in_thread)
    split = next((i for i, step in enumerate(interceptors)
                  if isinstance(step, DeadLetterInterceptor)), None)
    if split is None:
        return compose(handler, interceptors, innermost)
    inside = innermost
    on: list[Interceptor] = []  # innermost first
    for interceptor in reversed(interceptors[split + 1:]):
        wrapped = interceptor.wrap(handler, inside)
        if wrapped is not inside:
            on.append(interceptor)
        inside = wrapped
    dead_letters = interceptors[split]
    assert isinstance(dead_letters, DeadLetterInterceptor)
    kinds = [type(i) for i in on]
    outside = list(interceptors[:split])
    if kinds == [Decode] or kinds == [RetryInterceptor, Decode]:
        retry = on[0] if isinstance(on[0], RetryInterceptor) else None
        again = retry.again(handler, innermost) if retry is not None else None
        timer = None
        timed = outside[-1] if outside else None
        if isinstance(timed, HandlerDuration):  # metrics on: timed in the same step
            timer = timed.timer(handler)
            outside.pop()
        step = dead_letters.first_attempt(handler, handler_call(handler, in_thread), again,
                                          timer)
    else:
        step = dead_letters.wrap(handler, inside)
    return compose(handler, outside, step)
