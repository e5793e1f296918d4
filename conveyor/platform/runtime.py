"""Running one message through one handler: decode, call, retry, dead-letter.

:meth:`HandlerRuntime.deliver` never raises (except ``CancelledError``): when it
returns, the message is finished for that handler — handled, or stored in the
dead-letter queue — and may be acknowledged. The first call is made without any
retry machinery so the hot path stays lean; tenacity takes over after a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import msgspec
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.platform.message import DeadLetter, Message, now_ms

log = logging.getLogger("conveyor.runtime")

DeadLetterSink = Callable[[Sequence[DeadLetter]], Awaitable[None]]


@dataclass(slots=True)
class DeliveryStats:
    """Plain counters, read by metrics exporters; cheap enough for the hot path."""

    handled: int = 0
    retried: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0


class HandlerRuntime:
    def __init__(self, dead_letter: DeadLetterSink, stats: DeliveryStats | None = None) -> None:
        self._dead_letter_sink = dead_letter
        self.stats = stats or DeliveryStats()

    async def deliver(self, spec: HandlerSpec, msg: Message) -> None:
        try:
            arg = spec.decode(msg)
        except Exception as exc:  # DecodeError, or a user type's own validation
            await self.dead_letter(spec, msg, exc, attempts=0)
            return
        try:
            if spec.takes_context:
                await spec.fn(arg, MessageContext(msg, spec.name))
            else:
                await spec.fn(arg)
        except Exception as exc:
            self.stats.failed_attempts += 1
            await self._retry(spec, msg, exc)
            return
        self.stats.handled += 1

    async def _retry(self, spec: HandlerSpec, msg: Message, first: Exception) -> None:
        policy = spec.retry
        if policy.attempts == 1:
            await self.dead_letter(spec, msg, first, attempts=1)
            return
        # The wait before retry k (k = 1, 2, ...) is initial * multiplier**(k-1), capped.
        # tenacity computes the waits *between* its own attempts, so the first one is
        # slept here and tenacity's schedule is shifted by one step.
        jitter = wait_random(0, policy.jitter_s)
        await asyncio.sleep(min(policy.initial_delay_s, policy.max_delay_s) + jitter(None))  # type: ignore[arg-type]
        attempt_no = 1
        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.attempts - 1),
            wait=wait_exponential(
                multiplier=policy.initial_delay_s * policy.multiplier,
                exp_base=policy.multiplier,
                max=policy.max_delay_s,
            )
            + jitter,
            retry=retry_if_exception_type(Exception),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempt_no += 1
                    self.stats.retried += 1
                    again = msgspec.structs.replace(msg, attempt=attempt_no - 1)
                    try:
                        arg = spec.decode(again)
                        if spec.takes_context:
                            await spec.fn(arg, MessageContext(again, spec.name))
                        else:
                            await spec.fn(arg)
                    except Exception:
                        self.stats.failed_attempts += 1
                        raise
        except Exception as exc:
            await self.dead_letter(spec, msg, exc, attempts=attempt_no)
            return
        self.stats.handled += 1

    async def dead_letter(
        self, spec: HandlerSpec | None, msg: Message, exc: BaseException | str, attempts: int
    ) -> None:
        """Store ``msg`` in the dead-letter queue, retrying until the store accepts it.

        Only after this returns may the message be acknowledged: a broker outage here
        delays the ack, it never loses the message.
        """
        error_type = type(exc).__name__ if isinstance(exc, BaseException) else "Unroutable"
        letter = DeadLetter(
            message=msg,
            handler=spec.name if spec else "",
            error_type=error_type,
            error=str(exc),
            attempts=attempts,
            failed_at_ms=now_ms(),
        )
        log.warning(
            "dead-lettering message %s of %s after %d attempt(s): %s: %s",
            msg.id, msg.stream, attempts, error_type, exc,
        )
        delay_s = 0.05
        while True:
            try:
                await self._dead_letter_sink([letter])
                break
            except Exception as store_exc:  # any failure: keep the message, try again
                log.warning("dead-letter store failed (%s); retrying in %.2fs", store_exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)
        self.stats.dead_lettered += 1
