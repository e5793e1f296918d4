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

An interceptor that is off is not in the chain: with no pool, cell or app interceptor,
a message walks steps 3, 4, 5 (6) and 9 — built as one step that does what they do (see
:func:`build_chain`), which the agent's runner calls in parts
(:class:`~conveyor.platform.delivery.dead_letter.DirectCall`), timing it for step 2 and
entering step 1's span around it itself. The agent hands a
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
    wrapped,
)
from conveyor.platform.delivery.dead_letter import (
    DIRECT,
    DeadLetterInterceptor,
    DeadLetterStore,
    PutLetter,
    direct_call,
)
from conveyor.platform.delivery.metrics import HandlerDuration
from conveyor.platform.delivery.retry import RetryInterceptor
from conveyor.platform.handlers import HandlerSpec

if TYPE_CHECKING:
    from conveyor.platform.histograms import LocalMetrics
    from conveyor.platform.spans import LeanRecorder

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
    recorder: LeanRecorder | None = None,
    metrics: LocalMetrics | None = None,
    system: str = "",
    group: str = "",
    app: Sequence[Interceptor] = (),
    hosting: Sequence[Interceptor] = (),
    idempotency: Interceptor | None = None,
) -> list[Interceptor]:
    """The interceptors of every chain of a daemon, outermost first (see above).

    ``recorder``: where the consumer spans go when the SDK does not record them
    (:attr:`~conveyor.platform.telemetry.Telemetry.recorder`).
    With a tracer, ``put_letter`` should be the traced one
    (:func:`~conveyor.platform.delivery.tracing.traced_dead_letters`), as the agent's.
    ``metrics``: where the duration histogram is counted (a meter's
    :attr:`~conveyor.platform.telemetry.Telemetry.local`); None: no metrics step.
    """
    from conveyor.platform.delivery.tracing import ConsumerSpans, RetrySpans

    outer: list[Interceptor] = []
    inner: list[Interceptor] = []
    if tracer is not None:
        outer.append(ConsumerSpans(tracer, system=system, group=group, recorder=recorder))
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
    the dead-letter step but :class:`Decode`, :class:`RetryInterceptor` and its
    ``RetrySpans`` (in that order; retry and its spans may be off) — the shipped chain
    without app interceptors, pool, cell or idempotency — those steps and the handler
    call are one step (:meth:`DeadLetterInterceptor.first_attempt`): two frames and two
    calls less a message (about 0.2 µs measured on the no-op benchmark). With metrics
    on, the :class:`~conveyor.platform.delivery.metrics.HandlerDuration` just outside it
    times the deliveries inside that step too (:meth:`HandlerDuration.timer`), a
    coroutine frame less again; with tracing on, the ``ConsumerSpans`` outside that
    gives the step's :class:`~conveyor.platform.delivery.dead_letter.DirectCall` its
    :class:`~conveyor.platform.delivery.tracing.ConsumerScope`, so the agent's runner
    enters the consumer span itself. Each interceptor's ``wrap`` still runs once (but
    the fused ``HandlerDuration``'s and ``ConsumerSpans``')."""
    from conveyor.platform.delivery.tracing import ConsumerSpans, RetrySpans

    innermost = call_handler(handler, in_thread)
    split = next((i for i, step in enumerate(interceptors)
                  if isinstance(step, DeadLetterInterceptor)), None)
    if split is None:
        return compose(handler, interceptors, innermost)
    inside = innermost
    on: list[tuple[Interceptor, Step]] = []  # innermost first, with what each wrapped
    for interceptor in reversed(interceptors[split + 1:]):
        step = wrapped(interceptor, handler, inside)
        if step is not inside:
            on.append((interceptor, inside))
        inside = step
    dead_letters = interceptors[split]
    assert isinstance(dead_letters, DeadLetterInterceptor)
    kinds = [type(i) for i, _ in on]
    outside = list(interceptors[:split])
    # What may be on inside the dead-letter step for the shortcut, innermost first
    # (retry and its spans are off when the handler makes one attempt).
    if kinds not in ([Decode], [RetryInterceptor, Decode], [RetrySpans, RetryInterceptor, Decode]):
        return compose(handler, outside, dead_letters.wrap(handler, inside))
    # Retries run what the retry step wrapped: the handler, in a retry span if on.
    again = next((retry.again(handler, wrapped) for retry, wrapped in on
                  if isinstance(retry, RetryInterceptor)), None)
    timer = None
    timed = outside[-1] if outside else None
    if isinstance(timed, HandlerDuration):  # timed in the same step
        timer = timed.timer(handler)
        outside.pop()
    step = dead_letters.first_attempt(handler, handler_call(handler, in_thread), again, timer)
    spans = outside[-1] if outside else None
    if isinstance(spans, ConsumerSpans):  # the span entered around it
        scope = spans.scope(handler)
        outside.pop()
        direct = direct_call(step)
        step = ConsumerSpans.around(scope, step)
        if direct is not None:
            setattr(step, DIRECT, direct._replace(scope=scope))
    return compose(handler, outside, step)
