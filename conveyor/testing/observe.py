"""How the kit watches a real daemon without changing what it does.

* :class:`ObservedAdapter` is the embedded memory adapter, unchanged, that also tells
  the :class:`Observations` what was published, dead-lettered and acknowledged. An
  acknowledgement is the end of a message's path (it follows the handlers' return and
  the dead letter's storage), so it is where a message's records are written and where
  ``settle()`` is woken.
* :class:`AttemptRecorder` is one interceptor, put outermost among the app's own (inside
  decode, idempotency and retry), that notes each attempt and what it raised.
* :func:`observed_app` is a shallow copy of the user's app with that recorder, startup
  hooks that report when they end, batch handlers whose calls are noted, and retry and
  batch waits scaled by ``delay_scale``. The user's ``App`` object is not modified.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.adapters.memory import (
    MemoryAdapter,
    MemoryBroker,
    MemoryDeadLetters,
    MemoryReceiver,
)
from conveyor.client import Client
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.app import App, Hook
from conveyor.platform.delivery.chain import (
    STOPS,
    Delivery,
    Interceptor,
    Step,
    as_failure,
    base_exception_failure,
    stray_cancel_failure,
)
from conveyor.platform.errors import error_text
from conveyor.platform.handlers import HandlerFn, HandlerSpec
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import Replay
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.options import BatchOptions, IdempotencyOptions, RetryPolicy
from conveyor.testing.records import Attempt, Outcome, Record, raw_body

log = logging.getLogger("conveyor.testing")

YIELD_EVERY = 64
"""The embedded broker's enqueues between two in which the kit lets the event loop run
(:meth:`ObservedAdapter.enqueue`)."""

Position = tuple[int, int]
"""A message's place in the broker: (queue, offset)."""
Call = tuple[int, int, str]
"""One message and one handler: (queue, offset, handler name)."""


@dataclass(frozen=True, slots=True)
class BatchCall:
    """One call of a batch handler: the bodies it was given, and what it raised."""

    handler: str
    bodies: tuple[Any, ...]
    error: Exception | None


@dataclass(slots=True)
class Stop:
    """A handler call that raised ``KeyboardInterrupt`` or ``SystemExit``, held by the
    kit (see :class:`AttemptRecorder`)."""

    call: Call
    error: BaseException
    reported: bool = False


@dataclass(slots=True)
class HookRun:
    name: str
    running: bool = True
    error: BaseException | None = None
    """What the hook raised: an exception, or a ``KeyboardInterrupt`` or ``SystemExit``
    (which stop ``conveyor worker``), kept for ``settle()`` to raise."""
    reported: bool = False


class Observations:
    """Everything the kit saw, and the event ``settle()`` waits on."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.changed = asyncio.Event()
        """Set after every acknowledgement and every startup hook's end."""
        self.specs: dict[str, tuple[HandlerSpec, ...]] = app.subscriptions()
        self.broker: MemoryBroker | None = None
        self._sequence = 0
        self.published: dict[Position, tuple[int, Message]] = {}
        """Published and not settled yet, by position: (publish sequence, message)."""
        self.messages: dict[Position, Message] = {}
        """Everything published, in order, as stored."""
        self.attempts: dict[Call, list[Attempt]] = {}
        self.bodies: dict[Call, Any] = {}
        self.running: dict[Call, tuple[int, float, Delivery]] = {}
        """Calls under way: (attempt number, when it started, monotonic; the delivery)."""
        self.letters: dict[Call, DeadLetter] = {}
        self.records: list[tuple[int, int, Record]] = []
        """(publish sequence, handler index, record), in the order they settled."""
        self.batches: list[BatchCall] = []
        self.batches_running: dict[str, int] = {}
        self.swallowed: list[Call] = []
        """Calls that ended otherwise than by the cancellation their task was sent."""
        self.stopping = False
        """The kit is stopping the daemon: only then is a task's cancel count a stop's
        (Python 3.11's ``TaskGroup`` leaves one behind otherwise, CPython gh-116720)."""
        self.hooks: list[HookRun] = []
        self.stops: list[Stop] = []
        """Calls that raised ``KeyboardInterrupt`` or ``SystemExit``, held."""

    # -- what the adapter reports --------------------------------------------------------
    def published_to(self, messages: Sequence[Message], tokens: Sequence[SequenceToken]) -> None:
        for message, token in zip(messages, tokens, strict=True):
            self._sequence += 1
            stored = message.with_token(token)
            self.published[(token.queue, token.major)] = (self._sequence, stored)
            self.messages[(token.queue, token.major)] = stored

    def dead_lettered(self, letter: DeadLetter) -> None:
        token = letter.message.token
        if token is not None:
            self.letters[(token.queue, token.major, letter.handler)] = letter

    def acknowledged(self, log_of: Callable[[int], tuple[int, list[Message]]],
                     tokens: Sequence[SequenceToken]) -> None:
        """Write the records of the messages acknowledged now (still in the log)."""
        for token in tokens:
            base, items = log_of(token.queue)
            if not base <= token.major < base + len(items):
                continue  # acknowledged twice, or rewound past: nothing new settled
            position = (token.queue, token.major)
            seq, _ = self.published.pop(position, (None, None))
            if seq is None:  # appended without enqueue (a dead letter replayed)
                self._sequence += 1
                seq = self._sequence
            self._settle(seq, items[token.major - base])

    def _settle(self, seq: int, message: Message) -> None:
        token = message.token
        assert token is not None
        specs = self.specs.get(message.stream.namespace, ())
        if not specs:
            letter = self.letters.pop((token.queue, token.major, ""), None)
            outcome = Outcome.SKIPPED if letter is None else Outcome.DEAD_LETTERED
            self.records.append((seq, 0, Record(message, "", outcome, (), letter,
                                                raw_body(message))))
            return
        for index, spec in enumerate(specs):
            call = (token.queue, token.major, spec.name)
            attempts = tuple(self.attempts.pop(call, ()))
            letter = self.letters.pop(call, None)
            body = self.bodies.pop(call, None)
            if letter is not None:
                outcome = Outcome.DEAD_LETTERED
            elif (not attempts and spec.batch is None
                  and spec.option(IdempotencyOptions) is not None):
                outcome = Outcome.DEDUPLICATED
            else:
                outcome = Outcome.HANDLED
            if body is None:
                body = _decoded(spec, message)
            self.records.append((seq, index, Record(message, spec.name, outcome, attempts,
                                                    letter, body)))

    # -- what the chain reports ------------------------------------------------------------
    def attempted(self, call: Call, delivery: Delivery, error: Exception | None,
                  duration_s: float) -> None:
        self.attempts.setdefault(call, []).append(Attempt(delivery.attempt, error, duration_s))
        self.bodies[call] = delivery.body

    async def hold_stop(self, call: Call, message: Message, error: BaseException) -> None:
        """A call raised ``error`` (``KeyboardInterrupt``, ``SystemExit``), which stops
        ``conveyor worker`` at once and leaves its message unacknowledged. Raised on, it
        would leave the event loop and end the whole test run (pytest's session, or
        ``asyncio.run``); so the call is held here, unacknowledged, until the stop
        cancels it, and ``settle()`` raises :class:`WorkerStopped` naming it. So is a
        call that raised pytest's outcome of the test (:func:`held`): ``settle()``
        raises that."""
        if isinstance(error, STOPS):
            log.error("handler %s raised %r on message %s of %s: conveyor worker stops at "
                      "once there, without draining; the kit holds the call instead (its "
                      "message stays unacknowledged) and settle() raises WorkerStopped",
                      call[2], error, message.id, message.stream)
        else:
            log.error("handler %s raised pytest's %r on message %s of %s: the test's "
                      "outcome, not the handler's failure; the kit holds the call (its "
                      "message stays unacknowledged) and settle() raises it",
                      call[2], error, message.id, message.stream)
        self.stops.append(Stop(call, error))
        self.changed.set()
        await asyncio.get_running_loop().create_future()  # until the stop cancels it

    def hook_ended(self, run: HookRun) -> None:
        run.running = False
        self.changed.set()

    # -- reading -------------------------------------------------------------------------
    def sorted_records(self, since: int = 0) -> list[Record]:
        return [r for _, _, r in sorted(self.records[since:], key=lambda t: t[:2])]

    def running_calls(self, position: Position,
                      queued_in: Callable[[str, Delivery], tuple[str, str] | None]
                      ) -> list[str]:
        """The calls under way on the message at ``position``; ``queued_in(handler,
        delivery)`` names where such a call may wait before it runs, with that place's
        load (its pool, its cell), or is None."""
        now = time.monotonic()
        lines = []
        for (queue, offset, name), (attempt, since, delivery) in self.running.items():
            if (queue, offset) != position:
                continue
            call = (f"{name.rpartition('.')[2]} attempt {attempt}" if delivery.batch is None
                    else f"{name.rpartition('.')[2]} call on a batch of {len(delivery.batch)}")
            place = queued_in(name, delivery)
            if place is None:
                lines.append(f"{call} running for {now - since:.1f}s")
            else:
                lines.append(f"{call} running or queued {place[0]} for {now - since:.1f}s "
                             f"({place[1]})")
        return lines


def _decoded(spec: HandlerSpec, message: Message) -> Any:
    try:
        return spec.decode(message)
    except Exception:
        return raw_body(message)


class ObservedReceiver(MemoryReceiver):
    def __init__(self, broker: MemoryBroker, queue: int, group: str,
                 observations: Observations) -> None:
        super().__init__(broker, queue, group)
        self._observations = observations
        self._memory = broker

    def _log_of(self, queue: int) -> tuple[int, list[Message]]:
        log_ = self._memory.log(queue)
        return log_.base, log_.items

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        self._observations.acknowledged(self._log_of, tokens)
        await super().acknowledge(tokens)
        self._observations.changed.set()


class ObservedDeadLetters(MemoryDeadLetters):
    """The memory dead-letter store, reporting every letter it stores."""

    def __init__(self, broker: MemoryBroker, max_entries: int,
                 observations: Observations) -> None:
        super().__init__(broker, max_entries)
        self._observations = observations

    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        evicted = await super().put(group, letters)
        for letter in letters:
            self._observations.dead_lettered(letter)
        return evicted

    async def replay(self, group: str, replays: Sequence[Replay]
                     ) -> list[SequenceToken | None]:
        """Replays are publications: noted before anything can pull them (the memory
        store appends with no await, so nothing runs between its return and this)."""
        tokens = await super().replay(group, replays)
        for replay, token in zip(replays, tokens, strict=True):
            if token is not None:
                self._observations.published_to([replay.message], [token])
        return tokens


class ObservedAdapter(MemoryAdapter):
    """The memory adapter, reporting to ``observations`` (nothing else differs)."""

    def __init__(self, broker_name: str, observations: Observations, *,
                 max_dead_letters: int = 0) -> None:
        super().__init__(broker_name)
        self.dead_letters = ObservedDeadLetters(self.broker, max_dead_letters, observations)
        self.observations = observations
        observations.broker = self.broker
        self._enqueued = 0

    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        tokens = await super().enqueue(queue, messages)
        self.observations.published_to(messages, tokens)
        # A broker over a network lets the event loop run at every publish; the embedded
        # one returns at once, so code publishing in a loop (a startup hook or a handler
        # that never ends) held the loop: settle()'s deadline never came, the test hung.
        # Now and then is enough to let it come (at every one, a test publishing 10,000
        # messages one by one took six times as long).
        self._enqueued += 1
        if not self._enqueued % YIELD_EVERY:
            await asyncio.sleep(0)
        return tokens

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = ObservedReceiver(self.broker, queue, group, self.observations)
        self.broker.receivers.add(receiver)
        return receiver


class AttemptRecorder(Interceptor):
    """Notes every attempt of every (non-batch) handler: number, error, duration."""

    def __init__(self, observations: Observations) -> None:
        self._observations = observations

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        observations = self._observations
        running = observations.running
        name = handler.name
        clock = time.monotonic

        async def batch_call(call: Call, delivery: Delivery) -> Any:
            """Its messages are running (for ``unsettled()``) until it ends."""
            assert delivery.batch is not None
            started = clock()
            calls = [(t.queue, t.major, name) for t in
                     (m.token for m in delivery.batch) if t is not None]
            for each in calls:
                running[each] = (delivery.attempt, started, delivery)
            try:
                return await next(delivery)
            except BaseException as exc:
                if not held(exc):
                    raise
                for each in calls:
                    running.pop(each, None)
                await observations.hold_stop(call, delivery.message, exc)
                raise
            finally:
                for each in calls:
                    running.pop(each, None)

        async def recorded(delivery: Delivery) -> Any:
            token = delivery.message.token
            call = (token.queue, token.major, name) if token is not None else (-1, -1, name)
            if delivery.batch is not None:  # a batch call: recorded by batches() instead
                return await batch_call(call, delivery)
            started = clock()
            running[call] = (delivery.attempt, started, delivery)
            try:
                result = await next(delivery)
            except Exception as exc:
                running.pop(call, None)
                if observations.stopping and _cancel_swallowed():
                    observations.swallowed.append(call)
                observations.attempted(call, delivery, exc, clock() - started)
                raise
            except BaseException as exc:
                running.pop(call, None)
                if held(exc):
                    await observations.hold_stop(call, delivery.message, exc)
                    raise
                failure = _call_failure(exc)
                if failure is not None:  # the attempt failed, as the chain will say
                    observations.attempted(call, delivery, failure, clock() - started)
                raise
            running.pop(call, None)
            if observations.stopping and _cancel_swallowed():
                observations.swallowed.append(call)
            observations.attempted(call, delivery, None, clock() - started)
            return result

        return recorded


def held(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` is held by the kit (:meth:`Observations.
    hold_stop`) rather than left to the chain: a ``KeyboardInterrupt`` or ``SystemExit``,
    which stop ``conveyor worker``; or pytest's outcome of the test — ``pytest.fail()``,
    pytest-timeout's ``Failed``, raised wherever the main thread is, so in a handler
    that blocks the event loop — which the chain would take for the handler's failure
    and retry, and which is the test's to end with."""
    if isinstance(exc, STOPS):
        return True
    outcomes = sys.modules.get("_pytest.outcomes")  # never imported here: pytest's own
    return outcomes is not None and isinstance(exc, outcomes.OutcomeException)


def _cancel_swallowed() -> bool:
    """The task running the call was cancelled (the daemon stopping) and the call ended
    otherwise: the handler caught its ``CancelledError`` (a bare ``except:``, ``except
    BaseException``) and went on, so its agent does not see the stop. (A timeout inside
    the handler takes its own cancellation back: it does not count.)"""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _call_failure(exc: BaseException) -> Exception | None:
    """What a ``BaseException`` a call raised is to the chain: the attempt's failure
    (``HandlerCancelled``, ``HandlerBaseException``: retried, then dead-lettered), or
    None when it stops the call rather than failing it (a real cancellation, a
    ``KeyboardInterrupt`` or ``SystemExit``)."""
    try:
        failure = as_failure(exc)
    except BaseException:
        return None
    failure.__cause__ = exc
    return failure


def _thread_failure(exc: BaseException) -> Exception | None:
    """:func:`_call_failure` for a call on a handler thread (no task there, nothing can
    cancel it): a ``KeyboardInterrupt`` or ``SystemExit`` stops, anything else fails."""
    if isinstance(exc, STOPS):
        return None
    failure = (stray_cancel_failure() if isinstance(exc, asyncio.CancelledError)
               else base_exception_failure(exc))
    failure.__cause__ = exc
    return failure


def observed_app(app: App, observations: Observations, delay_scale: float) -> App:
    """A copy of ``app`` the kit can watch (see the module docstring)."""
    shadow = copy.copy(app)
    shadow.interceptors = (AttemptRecorder(observations), *app.interceptors)
    shadow.handlers = [_adjusted(spec, observations, delay_scale) for spec in app.handlers]
    shadow.on_startup = [_watched(hook, observations) for hook in app.on_startup]
    observations.specs = shadow.subscriptions()
    return shadow


def _adjusted(spec: HandlerSpec, observations: Observations, scale: float) -> HandlerSpec:
    options = dict(spec.options)
    fn = spec.fn
    if scale != 1.0:  # only the waits change (attempts, max_deliveries: as declared)
        retry = spec.retry
        options[RetryPolicy] = dataclasses.replace(
            retry, initial_delay_s=retry.initial_delay_s * scale,
            max_delay_s=retry.max_delay_s * scale, jitter_s=retry.jitter_s * scale,
        )
    batch = spec.batch
    if batch is not None:
        options[BatchOptions] = dataclasses.replace(batch, wait_ms=batch.wait_ms * scale)
        fn = _batch_recorder(spec, observations)
    return dataclasses.replace(spec, fn=fn, options=options)


def _batch_recorder(spec: HandlerSpec, observations: Observations) -> HandlerFn:
    """``spec``'s batch function, noting each call in ``observations``. A plain ``def``
    batch handler stays a plain ``def`` (the daemon runs it on a handler thread, so the
    counter it shares with the loop is locked); an ``async def`` one stays ``async``."""
    name, fn = spec.name, spec.fn
    running = observations.batches_running
    lock = threading.Lock()

    @contextlib.contextmanager
    def noted(bodies: list[Any], on_thread: bool) -> Iterator[None]:
        kept = tuple(bodies)  # the handler may change its list
        with lock:
            running[name] = running.get(name, 0) + 1
        outcome: list[Exception | None] = []  # stays empty for a stop
        try:
            yield
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
            raise
        except BaseException as exc:  # the call's failure as the chain takes it, if it is
            failure = (None if held(exc) else
                       _thread_failure(exc) if on_thread else _call_failure(exc))
            if failure is not None:
                outcome.append(failure)
            raise
        finally:
            with lock:
                running[name] -= 1
                if outcome:
                    observations.batches.append(BatchCall(name, kept, outcome[0]))

    if spec.sync:
        def recorded_sync(bodies: list[Any]) -> Any:
            with noted(bodies, on_thread=True):
                return fn(bodies)

        return recorded_sync

    async def recorded(bodies: list[Any]) -> Any:
        with noted(bodies, on_thread=False):
            return await fn(bodies)

    return recorded


def _watched(hook: Hook, observations: Observations) -> Hook:
    """The hook, reporting its end; what it raises is kept for ``settle()`` to raise."""
    run = HookRun(getattr(hook, "__qualname__", repr(hook)))
    observations.hooks.append(run)

    async def watched(client: Client) -> None:
        try:
            await hook(client)
        except BaseException as exc:  # a stop, let through, ends the test run
            if not (isinstance(exc, Exception) or held(exc)):
                raise  # its cancellation
            run.error = exc
            log.error("startup hook %s raised %s", run.name, error_text(exc))
        finally:
            observations.hook_ended(run)

    watched.__qualname__ = run.name  # as the daemon's lines name it
    return watched
