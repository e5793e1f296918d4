"""Stateless-worker pools: a handler's calls spread over workers with their own inboxes.

Scale-up follows Orleans' stateless workers: a job goes to an idle worker if there is
one (the most recently idle, whose caches are warm); otherwise a new worker is created
up to ``max_workers``; otherwise it joins the inbox of the worker with the fewest
waiting jobs. A worker whose inbox runs dry takes the oldest job from the fullest inbox
before it goes idle, so no job waits behind a call that blocks.

Scale-down is opt-in (``scale_down=``) and costs nothing when off: no collector task
runs and no extra state is kept. When on, a collector wakes every inspection period,
hands the average waiting count and how long the longest-idle worker has been idle to
the PID :class:`ScaleDownController` from :mod:`conveyor.workers.pools.scaledown` (anti-windup,
dead-zone, back-off and the idle keep-alive live there), and removes one random idle
worker whenever the controller says so — the longest-idle one when it has outlived
``idle_keepalive_s``.

Ordering: the pulling agent already runs one stream's messages one at a time per
handler, so a pool adds parallelism *across* streams only; per-stream order holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.platform.delivery.chain import handler_task
from conveyor.platform.errors import InvalidArgumentError, ShutdownError
from conveyor.platform.tasks import cancel_and_wait, raise_swallowed_cancel
from conveyor.workers.pools.scaledown import ScaleDownController, ScaleDownPolicy

log = logging.getLogger("conveyor.pool")

Job = Callable[[], Awaitable[Any]]


class _Worker:
    __slots__ = ("busy", "idle_since", "inbox", "name", "task", "wake")

    def __init__(self, name: str) -> None:
        self.name = name
        self.idle_since = 0.0
        self.inbox: deque[tuple[Job, asyncio.Future[Any]]] = deque()
        self.busy = False
        self.wake: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None


class StatelessWorkerPool:
    """Runs jobs (zero-argument coroutine functions) on up to ``max_workers`` workers.

    :meth:`run` returns the job's result or raises its exception. A caller cancelled
    while waiting does not cancel a job already started (it finishes, its result is
    dropped); a job not yet started is skipped.
    """

    def __init__(
        self,
        name: str,
        max_workers: int | None = None,
        scale_down: ScaleDownPolicy | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.max_workers = max_workers or os.cpu_count() or 1
        if self.max_workers < 1:
            raise InvalidArgumentError(
                f"pool {name!r}: max_workers must be >= 1, got {max_workers}"
            )
        self.workers: list[_Worker] = []
        self._idle: list[_Worker] = []
        self._serial = 0
        self._rng = rng or random.Random()
        self.policy = scale_down
        self.controller = ScaleDownController(scale_down) if scale_down is not None else None
        self._collector: asyncio.Task[None] | None = None
        self._closed = False
        # metrics
        self.peak_workers = 0
        self.created = 0
        self.removed = 0
        self.stolen = 0
        self._queued = 0  # jobs in inboxes, not started: nothing to steal when 0

    # -- metrics --------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def idle_workers(self) -> int:
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Jobs assigned to workers and not finished, the ones in progress included."""
        return sum(len(w.inbox) + w.busy for w in self.workers)

    def average_waiting(self) -> float:
        return self.waiting / len(self.workers) if self.workers else 0.0

    # -- running jobs -----------------------------------------------------------------
    async def run(self, job: Job) -> Any:
        if self._closed:
            raise ShutdownError(f"pool {self.name!r} is closed")
        if self.controller is not None and self._collector is None:
            self._collector = asyncio.create_task(self._collect(), name=f"pool-{self.name}")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued += 1
        self._dispatch(job, fut)
        return await fut

    def _dispatch(self, job: Job, fut: asyncio.Future[Any]) -> None:
        if self._idle:
            worker = self._idle.pop()  # rule 1: reuse an idle worker
            worker.busy = True
            worker.inbox.append((job, fut))
            if worker.wake is not None and not worker.wake.done():
                worker.wake.set_result(None)
        elif len(self.workers) < self.max_workers:  # rule 2: create one, up to the max
            worker = self._start_worker()
            worker.busy = True
            worker.inbox.append((job, fut))
        else:  # rule 3: the fewest waiting
            worker = min(self.workers, key=lambda w: len(w.inbox))
            worker.inbox.append((job, fut))

    def _start_worker(self) -> _Worker:
        self._serial += 1
        worker = _Worker(f"{self.name}-{self._serial}")
        worker.task = handler_task(self._work(worker), name=worker.name)
        self.workers.append(worker)
        self.created += 1
        self.peak_workers = max(self.peak_workers, len(self.workers))
        return worker

    async def _work(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        this = asyncio.current_task()
        inbox = worker.inbox
        while True:
            while inbox:
                job, fut = inbox.popleft()
                self._queued -= 1
                if fut.done():  # its caller went away before it started
                    continue
                try:
                    result = await job()
                except asyncio.CancelledError as exc:
                    if this is None or this.cancelling():  # the pool closing
                        if not fut.done():
                            fut.cancel()
                        raise
                    # Raised by the job, not sent to this task: its call's failure, as
                    # in a handler outside a pool. Raised on, it ended this worker, and
                    # the jobs in its inbox waited for ever.
                    if not fut.done():
                        fut.set_exception(exc)
                except BaseException as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(result)
                if not inbox and self._queued:
                    self._steal(inbox)
            raise_swallowed_cancel(this, self._closed)  # a job swallowed the close's cancel
            worker.busy = False
            worker.wake = loop.create_future()
            worker.idle_since = time.monotonic()
            self._idle.append(worker)  # the longest idle stays first: reuse pops the last
            await worker.wake
            worker.wake = None

    def _steal(self, inbox: deque[tuple[Job, asyncio.Future[Any]]]) -> None:
        """A worker whose inbox ran dry takes the oldest job waiting in the fullest
        inbox: a job queued behind a call that blocks (or runs long) would otherwise
        wait for it while this worker idles. Jobs are of different streams (the agent
        runs one stream's calls one at a time), so taking one out of turn keeps order."""
        fullest = max(self.workers, key=lambda w: len(w.inbox), default=None)
        if fullest is not None and fullest.inbox:
            inbox.append(fullest.inbox.popleft())
            self.stolen += 1

    # -- scale-down -------------------------------------------------------------------
    def remove_idle_worker(self, *, longest_idle: bool = False) -> bool:
        """Remove one random idle worker (or the one idle longest); False if none is idle."""
        if not self._idle:
            return False
        worker = self._idle.pop(0 if longest_idle else self._rng.randrange(len(self._idle)))
        self.workers.remove(worker)
        if worker.task is not None:
            worker.task.cancel()  # it is parked on its wake future with an empty inbox
        self.removed += 1
        return True

    def inspect(self, now_s: float | None = None) -> bool:
        """One inspection cycle: feed the controller, maybe remove a worker."""
        assert self.controller is not None
        now_s = time.monotonic() if now_s is None else now_s
        idle_for_s = now_s - self._idle[0].idle_since if self._idle else 0.0
        if self.controller.inspect(now_s, self.average_waiting(), len(self._idle), idle_for_s):
            kept_alive_too_long = idle_for_s >= self.controller.policy.idle_keepalive_s > 0
            return self.remove_idle_worker(longest_idle=kept_alive_too_long)
        return False

    async def _collect(self) -> None:
        assert self.policy is not None
        period_s = self.policy.inspection_period_s
        while True:
            await asyncio.sleep(period_s)  # a timer, not a poll for a condition
            try:
                if self.inspect():
                    log.debug("pool %s: removed an idle worker, %d left", self.name, self.size)
            except Exception:
                log.exception("pool %s: scale-down inspection failed", self.name)

    async def close(self) -> None:
        """Stop the collector and every worker; jobs not started are cancelled."""
        self._closed = True
        tasks = [w.task for w in self.workers if w.task is not None]
        if self._collector is not None:
            tasks.append(self._collector)
        for w in self.workers:
            for _, fut in w.inbox:
                fut.cancel()
        await cancel_and_wait(*tasks)
        self.workers.clear()
        self._idle.clear()
