"""Dead letters: the chain's boundary, and a store that never loses or jams one.

:class:`DeadLetterInterceptor` is the outermost step every chain has: no exception
passes it (``CancelledError`` aside). A delivery either returns — the message is
handled — or ends here, stored as a dead letter with its error; only then may the
agent acknowledge it. It also keeps the delivery counters.

:class:`DeadLetterStore` stores letters through the queue adapter:

* a store that is **down** (``BrokerConnectionError``) is retried with back-off for as
  long as it takes — the message stays unacknowledged meanwhile; the outage is logged at
  its start, every 30 s and at its end, and :attr:`DeadLetterStore.down_since` and
  :attr:`DeadLetterStore.waiting` show in ``conveyor status``;
* a letter past ``[dead_letters] max_entries`` evicts the oldest: counted
  (``dead_letters_evicted``) and logged, never silent;
* a store **unfit** for letters — a Redis key of another type where they go
  (:class:`StoreUnfitError`), a Kafka dead-letter topic that is compacted
  (:class:`ConfigError`) — is waited on the same way, with what is wrong logged once,
  as an error, when it is first met, and once when letters are stored again: no
  shorter letter would fit, so the letter is stored as it is once an operator fixes it;
* any **other** failure means this letter cannot be stored as it is (too large for the
  broker, say): retrying cannot fix that, so the next shorter form is stored instead
  (:meth:`DeadLetter.shortened`: full, then minimal, then bare — the reason always
  says why), and the queue flows on. A bare letter the store still refuses is waited on
  like an outage (logged as an error): something is wrong with the store itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.platform import forks
from conveyor.platform.backoff import BROKER_WRITE, Backoff
from conveyor.platform.delivery.chain import (
    Delivery,
    DeliveryStats,
    Interceptor,
    Step,
    as_failure,
    check_returned,
    over_limit,
)
from conveyor.platform.delivery.metrics import DURATION_CLOCK, recorder
from conveyor.platform.errors import (
    BrokerConnectionError,
    ConfigError,
    ConveyorError,
    StoreUnfitError,
    error_text,
)
from conveyor.platform.handlers import HandlerSpec, MessageContext, body_bytes
from conveyor.platform.ids import shown_name
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.outage import OutageLog
from conveyor.platform.throttled_log import ThrottledLog

if TYPE_CHECKING:
    from conveyor.platform.delivery.metrics import Timer
    from conveyor.platform.delivery.retry import Again
    from conveyor.platform.delivery.tracing import ConsumerScope

log = logging.getLogger("conveyor.dead_letters")

PutLetter = Callable[[DeadLetter], Awaitable[None]]
STORE_BACKOFF = BROKER_WRITE


def one_line(text: str) -> str:
    """``text`` for a log line: its line breaks escaped, so that an error's text can
    neither spread over lines nor pass for log lines of its own (the letter keeps it
    as raised)."""
    if "\n" not in text and "\r" not in text:
        return text
    return text.replace("\r", "\\r").replace("\n", "\\n")


class DeadLetterStore:
    """Stores one app's dead letters; :meth:`put` returns once the letter is stored."""

    def __init__(
        self,
        store: Callable[[Sequence[DeadLetter]], Awaitable[int]],
        stats: DeliveryStats,
        *,
        backoff: Backoff = STORE_BACKOFF,
    ) -> None:
        self._store = store
        self._stats = stats
        self._backoff = backoff
        self._outage = OutageLog(log, "the dead-letter store", "the broker", 30.0,
                                 "; the messages wait unacknowledged")
        self._notes = ThrottledLog(log, interval_s=60.0)
        self._unfit_since: float | None = None
        """``time.monotonic()`` when the store was first found unfit (None: it is not)."""
        self.waiting = 0
        """Letters waiting for the store to come back."""

    @property
    def down_since(self) -> float | None:
        """``time.monotonic()`` when the store went down or was found unfit for letters,
        or None while it works."""
        down = self._outage.down_since
        unfit = self._unfit_since
        return unfit if down is None else down if unfit is None else min(down, unfit)

    def _unfit(self, exc: Exception) -> None:
        """The store cannot hold letters until an operator fixes it: said once."""
        if self._unfit_since is None:
            self._unfit_since = time.monotonic()
            log.error("cannot store dead letters: %s (retried with back-off: stored once "
                      "it is fixed)", exc)

    def _stored(self) -> None:
        if self._unfit_since is not None:
            log.warning("dead letters stored again after %.1fs",
                        time.monotonic() - self._unfit_since)
            self._unfit_since = None

    async def put(self, letter: DeadLetter) -> None:
        self._notes.log(
            logging.WARNING, (letter.handler, letter.error_type),
            "dead-lettering message %s of %s (handler %r) after %d attempt(s): %s",
            shown_name(letter.message.id), letter.message.stream.shown(), letter.handler,
            letter.attempts,
            one_line(letter.reason),
        )
        failures = 0
        counted = False
        try:
            while True:
                try:
                    evicted = await self._store([letter])
                    break
                except BrokerConnectionError as exc:
                    failure: Exception = exc
                    self._outage.failing("storing a dead letter", failure)
                except (StoreUnfitError, ConfigError) as exc:  # nor would a shorter one
                    failure = exc
                    self._unfit(exc)
                except Exception as exc:  # this letter cannot be stored as it is
                    shorter = letter.shortened(error_text(exc))
                    if shorter is not None:
                        self._notes.log(
                            logging.WARNING, ("shortened", letter.form),
                            "dead letter of message %s not storable in %s form (%s); "
                            "storing it in %s form", shown_name(letter.message.id), letter.form,
                            error_text(exc), shorter.form,
                        )
                        letter = shorter
                        continue
                    failure = exc
                    self._notes.log(logging.ERROR, "refused",
                                    "the dead-letter store refuses even a bare letter "
                                    "(%s); retrying", error_text(exc))
                    self._outage.failing("storing a dead letter", failure)
                if not counted:
                    counted = True
                    self.waiting += 1
                failures += 1
                await self._backoff.sleep(failures)
        finally:
            if counted:
                self.waiting -= 1
        if failures:
            self._outage.ok()
            self._stored()
        self._stats.dead_lettered += 1
        if evicted:
            self._stats.dead_letters_evicted += evicted
            self._notes.log(logging.WARNING, "evicted",
                            "%d older dead letter(s) evicted to stay within "
                            "[dead_letters] max_entries (%d so far)", evicted,
                            self._stats.dead_letters_evicted)


class DeadLetterInterceptor(Interceptor):
    """Catches whatever the rest of the chain raises and stores it as a dead letter.

    ``attempts`` in the letter is the number of handler calls made (0 when the body
    did not decode). Counts handled, failed and retried deliveries on the way.
    """

    def __init__(self, put: PutLetter, stats: DeliveryStats) -> None:
        self._put = put
        self._stats = stats

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        stats = self._stats
        failed = self._failed(handler)

        async def guarded(delivery: Delivery) -> Any:
            try:
                await next(delivery)
            except Exception as exc:
                await failed(delivery, exc)
                return
            except BaseException as exc:
                await failed(delivery, as_failure(exc))
                return
            stats.handled += 1
            if delivery.attempt > 1:
                retried(stats, delivery.attempt)

        return guarded

    def first_attempt(self, handler: HandlerSpec, call: Callable[..., Awaitable[Any]],
                      again: Again | None, timer: Timer | None = None) -> Step:
        """This step, :class:`~conveyor.platform.delivery.chain.Decode` and the first
        attempt of :class:`~conveyor.platform.delivery.retry.RetryInterceptor` as one
        step that calls the handler function ``call`` itself — what ``wrap`` around
        ``Decode`` around ``RetryInterceptor`` around the handler does, with two frames
        and two calls less a message. :func:`~conveyor.platform.delivery.build_chain`
        uses it for a handler whose chain has nothing else inside this step (the shipped
        chain, with no app interceptor, pool, cell or idempotency for that handler).
        ``again`` runs the retries (:meth:`RetryInterceptor.again`); None: one attempt.
        ``timer``: the duration histogram of a
        :class:`~conveyor.platform.delivery.metrics.HandlerDuration` just outside this
        step, timed here (the same two clock reads around the same work) instead of in a
        frame of its own; None: not timed."""
        stats = self._stats
        failed = self._failed(handler)
        decode = handler.decode
        raw = decode is body_bytes  # the body as it came: no call to make
        limit = handler.retry.max_deliveries
        takes_context = handler.takes_context

        clock, record = (timer[0], recorder(timer[1])) if timer is not None else (
            time.perf_counter, None)

        async def guarded(delivery: Delivery) -> Any:
            started = clock() if record is not None else 0.0
            try:
                message = delivery.message
                if message.deliveries > limit:
                    raise over_limit(message, limit)
                delivery.body = body = message.body if raw else decode(message)
                delivery.attempt = 1
                failure = None
                try:
                    try:
                        if takes_context:
                            result = await call(body, delivery.context())
                        else:
                            result = await call(body)
                    finally:
                        if forks.copied:  # a process the handler forked: it ends here
                            forks.end_copy()
                    if result is not None:
                        check_returned(result)
                except Exception as exc:
                    if again is None:
                        raise
                    failure = exc
                except BaseException as exc:
                    failure = as_failure(exc)
                    if again is None:
                        raise failure from exc
                if again is not None and failure is not None:  # out of the handler's
                    await again(delivery, failure)  # except: chained as before
                    retried(stats, delivery.attempt)  # a retry succeeded
            except Exception as exc:
                await failed(delivery, exc)
                return
            else:
                stats.handled += 1
            finally:
                if record is not None:  # what HandlerDuration times (metrics.py)
                    record(clock() - started)

        setattr(guarded, DIRECT, self._direct(handler, call, again, timer))
        return guarded

    def _direct(self, handler: HandlerSpec, call: Callable[..., Awaitable[Any]],
                again: Again | None, timer: Timer | None) -> DirectCall:
        """:meth:`first_attempt`'s step taken apart for the agent's runner (see
        :class:`DirectCall`): what ``guarded`` does, with no frame of its own around
        the handler's and no :class:`Delivery` unless the call fails."""
        stats = self._stats
        failed = self._failed(handler)
        decode = handler.decode
        raw = decode is body_bytes
        limit = handler.retry.max_deliveries
        takes_context = handler.takes_context
        name = handler.name

        def start(message: Message) -> Awaitable[Any]:
            if message.deliveries > limit:
                raise NotStarted(over_limit(message, limit))
            if raw:
                body = message.body
            else:
                try:
                    body = decode(message)
                except Exception as exc:
                    raise NotStarted(exc) from exc
            if takes_context:
                return call(body, MessageContext(message, name))
            return call(body)

        async def finish(message: Message, failure: Exception) -> None:
            if isinstance(failure, NotStarted):  # never called: attempts=0
                await failed(Delivery(message, handler), failure.cause)
                return
            delivery = Delivery(message, handler, None, 1)
            if again is not None:
                try:
                    await again(delivery, failure)
                except Exception as exc:
                    await failed(delivery, exc)
                    return
                retried(stats, delivery.attempt)  # a retry succeeded
                stats.handled += 1
                return
            await failed(delivery, failure)

        if timer is None:
            return DirectCall(start, finish, stats)
        return DirectCall(start, finish, stats, timer[0], recorder(timer[1]))

    def _failed(self, handler: HandlerSpec) -> Callable[[Delivery, Exception], Awaitable[None]]:
        """What a delivery that raised becomes: counted, and stored as a dead letter."""
        stats = self._stats
        put = self._put
        name = handler.name

        async def failed(delivery: Delivery, exc: Exception) -> None:
            calls = delivery.attempt
            stats.failed_attempts += calls
            if calls > 1:
                stats.retried += calls - 1
            await put(DeadLetter.of(delivery.message, name, exc, calls))

        return failed


DIRECT = "direct"
"""The attribute of :meth:`DeadLetterInterceptor.first_attempt`'s step that holds its
:class:`DirectCall` (read with :func:`direct_call`)."""


class NotStarted(ConveyorError):
    """:attr:`DirectCall.start` refused the message before calling the handler (past
    its delivery limit, or a body that does not decode): ``cause`` is dead-lettered with
    ``attempts=0`` and never retried."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class DirectCall(NamedTuple):
    """The shipped chain's one step (:meth:`DeadLetterInterceptor.first_attempt`) in the
    parts the agent's runner calls itself, saving the step's coroutine frame and its
    :class:`Delivery` on every message that succeeds first time (about 0.15 µs of the
    no-op path's 1.3)::

        try:
            await start(message)   # the delivery limit, the decode, the handler's call
            stats.handled += 1
        except Exception as exc:
            await finish(message, exc)   # retries, dead letter: raises no Exception

    (:meth:`run`; the runner inlines it.) ``finish`` does what the step's ``except``
    branches do, so a chain run this way counts, retries and dead-letters exactly as
    when it is awaited (tests/unit/test_chain_shortcut.py). With metrics on, ``record``
    takes the time ``clock`` measured around the same work, as the step's ``finally``
    does (a call cancelled by a stop is not timed: the step timed it). With tracing on,
    ``scope`` is entered around all of it."""

    start: Callable[[Message], Awaitable[Any]]
    finish: Callable[[Message, Exception], Awaitable[None]]
    stats: DeliveryStats
    clock: Callable[[], float] = DURATION_CLOCK
    record: Callable[[float], None] | None = None
    """The duration histogram's series' count of one delivery; None: metrics off."""

    scope: ConsumerScope | None = None
    """The consumer span's scope of a :class:`~conveyor.platform.delivery.tracing.
    ConsumerSpans` just outside the step, entered before and left after the rest, as
    its step does (None: tracing off)."""

    async def run(self, message: Message) -> None:
        """One message through the step, as the runner runs it."""
        scope = self.scope
        entered = scope.enter(message) if scope is not None else None
        try:
            record = self.record
            started = self.clock() if record is not None else 0.0
            failure = None
            try:
                try:
                    await self.start(message)
                finally:
                    if forks.copied:  # a process the handler forked: it ends here
                        forks.end_copy()
                self.stats.handled += 1
            except Exception as exc:
                failure = exc
            except BaseException as exc:  # raised again for a stop (as_failure)
                failure = as_failure(exc)
            if failure is not None:  # out of the except, as the step calls its retries
                await self.finish(message, failure)
            if record is not None:
                record(self.clock() - started)
        finally:
            if scope is not None and entered is not None:
                scope.leave(entered)


def direct_call(step: Step) -> DirectCall | None:
    """``step``'s :class:`DirectCall` if it is the shipped chain's one step (what
    :func:`~conveyor.platform.delivery.build_chain` built), else None."""
    direct = getattr(step, DIRECT, None)
    return direct if isinstance(direct, DirectCall) else None


def retried(stats: DeliveryStats, calls: int) -> None:
    """Count ``calls`` handler calls of one delivery, the first ``calls - 1`` failed."""
    stats.failed_attempts += calls - 1
    stats.retried += calls - 1


def outage_age_s(store: DeadLetterStore) -> float | None:
    """Seconds the store has been down, for status; None while it works."""
    since = store.down_since
    return None if since is None else time.monotonic() - since

