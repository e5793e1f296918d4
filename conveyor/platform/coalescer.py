"""Gathering single ``publish`` calls into one send per queue.

Each queue has a list of waiting messages and at most one send on its way. A call
appends its message and gets a future; the queue's flusher (started by the first call
that finds none) waits one loop turn — or ``linger_s`` — so that the calls made
meanwhile join, sends what is waiting (at most ``max_batch``), resolves each future with
its message's token, and goes on while more arrived during the send. So:

* per-stream order holds: a stream lives on one queue, a queue's messages go in the
  order of the calls, and a queue never has two sends under way at once;
* batches grow with the load by themselves — whatever arrives during one round trip
  goes in the next — with no timer on the path of a lone publisher;
* a call returns only when its message is stored. A failed send fails its calls and
  every call waiting behind it on that queue (sending those would put them before a
  retry of the failed ones); the next call starts afresh. A send stored in part
  (:class:`~conveyor.PartialPublishError`) gives each of its calls its own message's
  fate: its token, the error that refused it, or :class:`~conveyor.PublishUncertain`;
* a call cancelled before its batch left is not sent; once sent, cancelling does not
  take it back;
* :meth:`close` waits until every waiting message is sent (or has failed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from conveyor.platform.errors import PartialPublishError, PublishUncertain, ShutdownError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import Message

Enqueue = Callable[[int, Sequence[Message]], Awaitable[list[SequenceToken]]]
_Waiting = list[tuple[Message, "asyncio.Future[SequenceToken]"]]

MAX_BATCH = 1000
"""Messages per send at most (Redis' publishing script takes up to 1000 per call)."""


class PublishCoalescer:
    """One send per queue at a time, of every message waiting for it (module docstring)."""

    def __init__(self, enqueue: Enqueue, linger_s: float = 0.0,
                 max_batch: int = MAX_BATCH) -> None:
        self._enqueue = enqueue
        self._linger_s = linger_s
        self._max_batch = max_batch
        self._waiting: dict[int, _Waiting] = {}
        self._flushers: dict[int, asyncio.Task[None]] = {}
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
        if queue not in self._flushers:
            self._flushers[queue] = asyncio.create_task(
                self._flush(queue, waiting), name=f"conveyor-publish-q{queue}"
            )
        return future

    async def _flush(self, queue: int, waiting: _Waiting) -> None:
        batch: _Waiting = []
        try:
            if self._linger_s:  # else: a task starts a loop turn after it was created,
                await asyncio.sleep(self._linger_s)  # so the calls of that turn are in
            while waiting:
                batch = [(m, f) for m, f in waiting[: self._max_batch] if not f.cancelled()]
                del waiting[: self._max_batch]
                if not batch:
                    continue
                try:
                    tokens = await self._enqueue(queue, [m for m, _ in batch])
                except PartialPublishError as exc:  # each caller of the batch its own fate
                    _settle(batch, exc)
                    _fail(waiting, next(iter(exc.failed.values()), exc))
                    waiting.clear()
                    continue
                except Exception as exc:  # handed to every caller of the batch
                    batch += waiting
                    waiting.clear()
                    _fail(batch, exc)
                    continue
                for (_, future), token in zip(batch, tokens, strict=True):
                    if not future.done():
                        future.set_result(token)
                batch = []
        except asyncio.CancelledError:
            for _, future in [*batch, *waiting]:
                future.cancel()
            waiting.clear()
            raise
        finally:
            del self._flushers[queue]

    async def close(self) -> None:
        """Refuse new calls; return when every waiting message is sent or has failed."""
        self._closed = True
        while self._flushers:
            await asyncio.gather(*self._flushers.values(), return_exceptions=True)


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
