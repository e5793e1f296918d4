"""Gathering single ``publish`` calls into rounds: one send for every queue's waiting
messages.

Each queue has a list of waiting messages. A call appends its message and gets a
future; the first call that finds nothing scheduled schedules a dispatch one loop turn
later — or ``linger_s`` — so that the calls made meanwhile join. The dispatch takes
what every queue without a send on its way has waiting (at most ``max_batch`` a queue)
and sends it: where the adapter sends several queues in one round trip
(``QueueAdapter.publishes_queues_together``: Redis, one pipeline), all of them in one
:meth:`~conveyor.platform.adapter.QueueAdapter.enqueue_queues`; elsewhere (a Redis
Cluster, whose queues live on different nodes) one send per queue, so that a queue
whose node fails over holds no other back. When a send returns, each future gets its
message's token, and what arrived for its queues meanwhile is dispatched. So:

* per-stream order holds: a stream lives on one queue, a queue's messages go in the
  order of the calls, and a queue never has two sends on their way at once;
* batches grow with the load by themselves — whatever arrives during one round trip
  goes in the next — with no timer on the path of a lone publisher; and many
  publishers spread over many queues cost one round trip a round, not one a queue
  (measured in docs/performance.md, "Single publishes");
* a call returns only when its message is stored. A queue whose send failed fails its
  calls and every call waiting behind it on that queue (sending those would put them
  before a retry of the failed ones); the other queues of the round get their own
  fate, and the queue's next call starts afresh. A send stored in part
  (:class:`~conveyor.PartialPublishError`) gives each of its calls its own message's
  fate: its token, the error that refused it, or :class:`~conveyor.PublishUncertain`;
* a call cancelled before its round left is not sent; once sent, cancelling does not
  take it back. A send or dispatch that is itself cancelled (the event loop's tasks
  cancelled, on Ctrl-C) cancels the calls it held and those waiting;
* :meth:`close` waits until every waiting message is sent (or has failed), except a
  send none of whose calls is still waiting: every one was cancelled after the round
  left (a timeout around ``publish``; Ctrl-C in a :class:`~conveyor.SyncClient`, whose
  close would otherwise sit out the send's retries, ``retry_max_s``). Nobody is left
  to learn what it stored, so it is cancelled: its messages may or may not be stored,
  as they may be for any cancelled call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from conveyor.platform.errors import (
    BrokerError,
    PartialPublishError,
    PublishUncertain,
    ShutdownError,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import Message

EnqueueQueues = Callable[[Mapping[int, Sequence[Message]]],
                         Awaitable[Mapping[int, list[SequenceToken] | Exception]]]
"""A round's send: ``QueueAdapter.enqueue_queues``."""
_Waiting = list[tuple[Message, "asyncio.Future[SequenceToken]"]]

MAX_BATCH = 1000
"""Messages of one queue per round at most (Redis' publishing script takes up to 1000
per call)."""


class PublishCoalescer:
    """Rounds of every queue's waiting messages (module docstring). ``together``: send
    the queues of a round in one ``enqueue_queues`` (else one each)."""

    def __init__(self, enqueue_queues: EnqueueQueues, linger_s: float = 0.0,
                 max_batch: int = MAX_BATCH, *, together: bool = True) -> None:
        self._send = enqueue_queues
        self._linger_s = linger_s
        self._max_batch = max_batch
        self._together = together
        self._waiting: dict[int, _Waiting] = {}
        """Per queue, the calls not yet sent, in call order; no empty lists."""
        self._in_flight: set[int] = set()
        """Queues with a send on its way."""
        self._scheduled: asyncio.Task[None] | None = None
        """The dispatch to come, if one is scheduled."""
        self._sends: dict[asyncio.Task[None], dict[int, _Waiting]] = {}
        """The sends on their way, each with its round."""
        self._abandoned: set[asyncio.Task[None]] = set()
        """Sends cancelled by :meth:`close` because no call waits for them."""
        self._closed = False

    def submit(self, queue: int, msg: Message) -> asyncio.Future[SequenceToken]:
        """Queue ``msg``; the future resolves to its token once it is stored."""
        if self._closed:
            raise ShutdownError("the client is closed: publish before closing it")
        future: asyncio.Future[SequenceToken] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.get(queue)
        if waiting is None:
            waiting = self._waiting[queue] = []
        waiting.append((msg, future))
        if self._scheduled is None and queue not in self._in_flight:
            task = self._scheduled = asyncio.create_task(self._dispatch_soon(),
                                                         name="conveyor-publish")
            task.add_done_callback(self._dispatch_done)
        return future

    async def _dispatch_soon(self) -> None:
        if self._linger_s:  # else: a task starts a loop turn after it was created,
            await asyncio.sleep(self._linger_s)  # so the calls of that turn are in
        self._scheduled = None
        self._dispatch()

    def _dispatch_done(self, task: asyncio.Task[None]) -> None:
        if self._scheduled is task:  # cancelled, perhaps before it ever ran
            self._scheduled = None
        if task.cancelled():
            self._cancel_waiting()

    def _dispatch(self) -> None:
        """Send what every queue without a send on its way has waiting."""
        round_: dict[int, _Waiting] = {}
        for queue, waiting in list(self._waiting.items()):
            if queue in self._in_flight:
                continue
            batch = [(m, f) for m, f in waiting[: self._max_batch] if not f.cancelled()]
            del waiting[: self._max_batch]
            if not waiting:
                del self._waiting[queue]
            if batch:
                round_[queue] = batch
        if not round_:
            return
        for part in [round_] if self._together else [{q: b} for q, b in round_.items()]:
            self._in_flight.update(part)
            task = asyncio.create_task(self._send_round(part), name="conveyor-publish-send")
            self._sends[task] = part
            task.add_done_callback(self._send_done)

    def _send_done(self, task: asyncio.Task[None]) -> None:
        del self._sends[task]
        self._abandoned.discard(task)

    async def _send_round(self, round_: dict[int, _Waiting]) -> None:
        try:
            outcomes: Mapping[int, list[SequenceToken] | Exception]
            try:
                outcomes = await self._send({q: [m for m, _ in b] for q, b in round_.items()})
            except Exception as exc:  # the send as a whole: every queue's fate
                outcomes = dict.fromkeys(round_, exc)
        except asyncio.CancelledError:
            for batch in round_.values():
                for _, future in batch:
                    future.cancel()
            self._in_flight.difference_update(round_)
            current = asyncio.current_task()
            if current is not None and current in self._abandoned:  # by close(): the
                if self._scheduled is None and self._waiting:  # others' calls still go
                    self._dispatch()
            else:
                self._cancel_waiting()
            raise
        self._in_flight.difference_update(round_)
        for queue, batch in round_.items():
            outcome = outcomes.get(queue)
            self._settle(queue, batch, BrokerError(
                f"publishing to queue {queue}: the adapter reported no outcome"
            ) if outcome is None else outcome)
        if self._scheduled is None and any(q not in self._in_flight for q in self._waiting):
            self._dispatch()  # what arrived for these queues during the send

    def _cancel_waiting(self) -> None:
        """Cancel every call not yet sent (the loop's tasks are being cancelled)."""
        for waiting in self._waiting.values():
            for _, future in waiting:
                future.cancel()
        self._waiting.clear()

    def _settle(self, queue: int, batch: _Waiting,
                outcome: list[SequenceToken] | Exception) -> None:
        """Each call of ``batch`` its fate; on a failure, also the calls behind it."""
        if isinstance(outcome, PartialPublishError):  # each caller of the batch its own
            _settle(batch, outcome)
            _fail(self._waiting.pop(queue, []), next(iter(outcome.failed.values()), outcome))
        elif isinstance(outcome, Exception):  # handed to every caller of the batch
            _fail([*batch, *self._waiting.pop(queue, [])], outcome)
        else:
            for (_, future), token in zip(batch, outcome, strict=True):
                if not future.done():
                    future.set_result(token)

    async def close(self) -> None:
        """Refuse new calls; return when every waiting message is sent or has failed. A
        send whose calls were all cancelled is cancelled, not waited for (module
        docstring)."""
        self._closed = True
        while self._scheduled is not None or self._sends:
            for task, round_ in self._sends.items():
                if task not in self._abandoned and all(
                        future.cancelled() for batch in round_.values() for _, future in batch):
                    self._abandoned.add(task)
                    task.cancel()
            await asyncio.wait({*self._sends, *([self._scheduled] if self._scheduled else [])})


def _settle(batch: _Waiting, exc: PartialPublishError) -> None:
    for msg, future in batch:
        if future.done():
            continue
        if msg.id in exc.published:
            future.set_result(exc.published[msg.id])
        elif msg.id in exc.failed:
            future.set_exception(exc.failed[msg.id])
        else:
            future.set_exception(PublishUncertain(
                f"{exc}: this message may or may not have been stored", (msg.id,)))


def _fail(batch: _Waiting, exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
