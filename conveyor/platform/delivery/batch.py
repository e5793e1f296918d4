"""The batch step: decode, call, retry and bisect one batch of a ``batch_size=N`` handler.

What the per-message chain does for one message, this step does for a batch, in one
place (a batch handler has no per-message chain):

1. **decode** each body with the element type of the handler's ``list[T]``; a body
   that does not decode is dead-lettered at once (``attempts=0``) and left out of the
   batch — the handler never sees it;
2. **call** the handler with the decoded bodies, in batch order, through the app's
   interceptors (a batch is one :class:`~conveyor.platform.delivery.chain.Delivery`
   whose ``batch`` lists its messages);
3. **retry** a failing batch per the handler's :class:`~conveyor.platform.options.RetryPolicy`
   (the same delays; each attempt decodes afresh);
4. **bisect** a batch that failed its last attempt: call the handler on each half, left
   first, and split again whatever half fails, down to single messages. A single message
   gets the rest of the retry policy on its own (``attempts`` calls in all, counting the
   bisection's) and is dead-lettered with *its own* error; every half that succeeded is
   handled. With ``p`` poison messages in a batch of ``n`` that costs about
   ``2 p log2(n)`` calls beyond the retries.

Nothing raised passes this step (``CancelledError`` aside): when it returns, every
message of the batch is handled or stored as a dead letter, and the agent may
acknowledge them all. A message of a half that succeeded may have been part of failed
calls before (the whole batch, a larger half): batch handlers should write idempotently
per message, as at-least-once delivery asks of every handler anyway.

With a tracer, one ``process <namespace>`` CONSUMER span covers the batch, linked to each
message's producer span (the messaging semantic conventions' shape for batch receive);
dead letters are stored inside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Tracer

from conveyor.platform.delivery.chain import (
    Delivery,
    DeliveryStats,
    Interceptor,
    InThread,
    as_failure,
    call_handler,
    compose,
    over_limit,
)
from conveyor.platform.delivery.dead_letter import PutLetter
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.options import RetryPolicy
from conveyor.platform.telemetry import (
    CONSUMER_GROUP,
    DESTINATION,
    HANDLER,
    OPERATION_NAME,
    OPERATION_TYPE,
    PARTITION,
    PROPAGATOR,
    SYSTEM,
)

BatchStep = Callable[[Sequence[Message]], Awaitable[None]]
"""Runs one batch to the end: every message handled or dead-lettered when it returns."""

BATCH_COUNT = "messaging.batch.message_count"


class _Batch:
    """One batch on its way through the step (state of the bisection)."""

    __slots__ = ("call", "decode", "handler", "name", "policy", "put", "stats")

    def __init__(self, handler: HandlerSpec, put: PutLetter, stats: DeliveryStats,
                 in_thread: InThread | None = None,
                 interceptors: Sequence[Interceptor] = ()) -> None:
        self.decode = handler.decode
        # The app's interceptors around each call of the handler on a batch.
        self.call = compose(handler, interceptors, call_handler(handler, in_thread))
        self.handler = handler
        self.name = handler.name
        self.policy: RetryPolicy = handler.retry
        self.put = put
        self.stats = stats

    async def run(self, messages: Sequence[Message]) -> None:
        limit = self.policy.max_deliveries
        if any(m.deliveries > limit for m in messages):
            # Delivered more than max_deliveries times: a batch that kills or stalls its
            # worker every time. Batches are not run one message at a time on
            # redelivery, so its messages' deliveries are counted alike: they become
            # dead letters together, and the stream flows on.
            kept = []
            for m in messages:
                if m.deliveries > limit:
                    await self._dead_letter(m, over_limit(m, limit), 0)
                else:
                    kept.append(m)
            messages = kept
            if not messages:
                return
        decode = self.decode
        try:
            bodies = [decode(m) for m in messages]
        except Exception:  # at least one does not decode: sort them one by one
            messages, bodies = await self._decode_each(messages)
            if not messages:
                return
        failure = await self._attempts(messages, bodies, 1, self.policy.attempts)
        if failure is None:
            self.stats.handled += len(messages)
        elif len(messages) == 1:
            await self._dead_letter(messages[0], failure, self.policy.attempts)
        else:
            await self._bisect(messages)

    async def _decode_each(self, messages: Sequence[Message]) -> tuple[list[Message], list[Any]]:
        kept: list[Message] = []
        bodies: list[Any] = []
        for m in messages:
            try:
                bodies.append(self.decode(m))
            except Exception as exc:
                await self._dead_letter(m, exc, 0)
                continue
            kept.append(m)
        return kept, bodies

    async def _attempts(self, messages: Sequence[Message], bodies: list[Any] | None,
                        first: int, last: int) -> Exception | None:
        """Calls ``first`` .. ``last`` (1-based, per the retry policy) on ``messages``;
        None once one succeeds, else the last error. ``bodies`` None: decode afresh."""
        policy = self.policy
        stats = self.stats
        failure: Exception | None = None
        batch = list(messages)
        for attempt in range(first, last + 1):
            if attempt > 1:
                await asyncio.sleep(policy.backoff_s(attempt - 1))
                stats.retried += 1
            if bodies is None or attempt > first:  # an attempt never sees an earlier one's
                bodies = [self.decode(m) for m in messages]
            try:
                await self.call(Delivery(batch[0], self.handler, bodies, attempt, batch))
            except Exception as exc:
                stats.failed_attempts += 1
                failure = exc
                continue
            except BaseException as exc:  # raised again for a stop (as_failure)
                stats.failed_attempts += 1
                failure = as_failure(exc)
                continue
            return None
        return failure

    async def _bisect(self, messages: Sequence[Message]) -> None:
        """``messages`` failed together: find the ones that fail on their own."""
        mid = len(messages) // 2
        for half in (messages[:mid], messages[mid:]):
            if len(half) == 1:  # the bisection's call is its first attempt
                failure = await self._attempts(half, None, 1, self.policy.attempts)
                if failure is not None:
                    await self._dead_letter(half[0], failure, self.policy.attempts)
                    continue
            else:
                failure = await self._attempts(half, None, 1, 1)
                if failure is not None:
                    await self._bisect(half)
                    continue
            self.stats.handled += len(half)

    async def _dead_letter(self, message: Message, error: Exception, attempts: int) -> None:
        await self.put(DeadLetter.of(message, self.name, error, attempts))


def batch_step(
    handler: HandlerSpec,
    put: PutLetter,
    stats: DeliveryStats,
    *,
    tracer: Tracer | None = None,
    system: str = "",
    group: str = "",
    in_thread: InThread | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> BatchStep:
    """The step that runs ``handler``'s batches (see the module docstring); a plain
    ``def`` handler is called through ``in_thread``, once per batch; ``interceptors``
    (the app's) wrap each call."""
    batch = _Batch(handler, put, stats, in_thread, interceptors)
    if tracer is None:
        return batch.run
    fixed = {
        SYSTEM: system,
        DESTINATION: handler.namespace,
        OPERATION_TYPE: "process",
        OPERATION_NAME: "process",
        CONSUMER_GROUP: group,
        HANDLER: handler.name,
    }
    span_name = f"process {handler.namespace}"

    async def traced(messages: Sequence[Message]) -> None:
        links = []
        for m in messages:
            producer = trace.get_current_span(PROPAGATOR.extract(m.headers)).get_span_context()
            if producer.is_valid:
                links.append(Link(producer))
        attributes: dict[str, Any] = dict(fixed)
        attributes[BATCH_COUNT] = len(messages)
        if messages and messages[0].token is not None:
            attributes[PARTITION] = str(messages[0].token.queue)
        # A new trace (no parent): a batch belongs to many producers' traces at once.
        with tracer.start_as_current_span(span_name, context=trace.set_span_in_context(
                trace.INVALID_SPAN), kind=SpanKind.CONSUMER, attributes=attributes,
                links=links):
            await batch.run(messages)

    return traced
