"""Retry: a failing attempt is tried again, in place, per the handler's RetryPolicy.

The first attempt costs one ``try`` and nothing else. After a failure the step sleeps
``policy.delay_before(k)`` plus up to ``jitter_s``, raises ``message.attempt`` (what a
handler's ``ctx.attempt`` shows), decodes the body afresh (an attempt never sees what
an earlier one did to it) and calls the rest of the chain again; after the last
attempt the last error goes on out, to the dead-letter step. Retries happen in place,
so the stream's later messages wait: order is kept. Absent from a chain whose policy
has ``attempts=1``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from conveyor.platform.delivery.chain import Delivery, Interceptor, Step, as_failure
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.options import RetryPolicy

Again = Callable[[Delivery, Exception], Awaitable[Any]]
"""``again(delivery, failure)``: the attempts after a failed first one; returns what the
first successful attempt returns, or raises the last failure."""


class RetryInterceptor(Interceptor):
    options = RetryPolicy

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        again = self.again(handler, next)
        if again is None:
            return next

        async def retrying(delivery: Delivery) -> Any:
            try:
                return await next(delivery)
            except Exception as exc:
                failure = exc
            except BaseException as exc:
                failure = as_failure(exc)
            return await again(delivery, failure)

        return retrying

    def again(self, handler: HandlerSpec, next: Step) -> Again | None:
        """The retries of ``handler`` around ``next``, once its first attempt has failed;
        None when its policy makes one attempt only. (Also what the dead-letter step runs
        when it makes the first attempt itself: ``DeadLetterInterceptor.first_attempt``.)"""
        policy = handler.retry
        if policy.attempts == 1:
            return None
        decode = handler.decode

        async def again(delivery: Delivery, failure: Exception) -> Any:
            for retry in range(1, policy.attempts):
                await asyncio.sleep(policy.backoff_s(retry))
                message = delivery.message
                delivery.message = message = msgspec.structs.replace(
                    message, attempt=message.attempt + 1
                )
                delivery.attempt = retry + 1
                delivery.body = decode(message)
                try:
                    return await next(delivery)
                except Exception as exc:
                    failure = exc
                except BaseException as exc:
                    failure = as_failure(exc)
            raise failure

        return again
