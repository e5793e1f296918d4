"""Cells: one dispatcher and one worker pool per tenant, so a flood cannot starve others.

A handler declared with ``cell_key=`` routes every message to the cell named by a
header (``"header:tenant"``) or a body field (``"body:tenant"``). Each cell has its own
:class:`Dispatcher` and its own number of workers. Workers *pull*, as in the Akka
provisioning engine: a worker tells its dispatcher it is ready and receives exactly one
job; the job runs under a timeout, and a job that times out fails with
:class:`CellJobTimeout`, which the handler runtime retries and finally dead-letters
like any other handler error.

Cells resize while running without dropping a job: growing starts workers; shrinking
tells the newest workers to stop, and each one stops after its current job (an idle
one at once). Jobs waiting in the dispatcher stay there for the workers that remain.

Ordering: as with pools, the pulling agent runs one stream's messages one at a time
per handler, so cells only add parallelism across streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from conveyor.platform.delivery.chain import handler_task
from conveyor.platform.errors import ConveyorError, InvalidArgumentError
from conveyor.platform.tasks import cancel_and_wait, raise_swallowed_cancel

log = logging.getLogger("conveyor.cells")

Job = Callable[[], Awaitable[Any]]
DEFAULT_CELL = "_default"


class CellJobTimeout(ConveyorError):
    """A cell's job ran longer than its ``job_timeout_s``; retried, then dead-lettered."""


class _Job:
    __slots__ = ("fn", "fut")

    def __init__(self, fn: Job, fut: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.fut = fut


class Dispatcher:
    """Jobs waiting for a worker, and workers waiting for a job; pairs them up."""

    def __init__(self) -> None:
        self.pending: deque[_Job] = deque()
        self._ready: deque[asyncio.Future[_Job]] = deque()
        self.handed_back = 0  # jobs returned by a worker stopped before it started them

    def submit(self, job: _Job) -> None:
        while self._ready:
            worker = self._ready.popleft()
            if not worker.done():
                worker.set_result(job)
                return
        self.pending.append(job)

    def _hand_back(self, job: _Job) -> None:
        self.handed_back += 1
        while self._ready:
            worker = self._ready.popleft()
            if not worker.done():
                worker.set_result(job)
                return
        self.pending.appendleft(job)

    async def ready(self) -> _Job:
        """A worker is ready: wait for one job (cancellable; a cancelled wait takes none)."""
        while self.pending:
            job = self.pending.popleft()
            if not job.fut.done():
                return job
        waiter: asyncio.Future[_Job] = asyncio.get_running_loop().create_future()
        self._ready.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_back(waiter.result())  # handed over as we stopped
            else:
                with contextlib.suppress(ValueError):
                    self._ready.remove(waiter)
            raise


class _CellWorker:
    __slots__ = ("busy", "stopping", "task")

    def __init__(self) -> None:
        self.busy = False
        self.stopping = False
        self.task: asyncio.Task[None] | None = None


class Cell:
    """One tenant's dispatcher and its workers."""

    def __init__(self, name: str, size: int, job_timeout_s: float | None) -> None:
        if size < 1:
            raise InvalidArgumentError(f"cell {name!r}: size must be >= 1, got {size}")
        self.name = name
        self.job_timeout_s = job_timeout_s
        self.dispatcher = Dispatcher()
        self.workers: list[_CellWorker] = []
        self.handled = 0
        self.timed_out = 0
        self.resize(size)

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def queue_length(self) -> int:
        return len(self.dispatcher.pending)

    @property
    def busy(self) -> int:
        return sum(1 for w in self.workers if w.busy)

    def resize(self, size: int) -> None:
        """Grow at once; shrink by letting the newest workers stop after their current job."""
        if size < 1:
            raise InvalidArgumentError(f"cell {self.name!r}: size must be >= 1, got {size}")
        while len(self.workers) < size:
            worker = _CellWorker()
            worker.task = handler_task(self._work(worker), name=f"cell-{self.name}")
            self.workers.append(worker)
        while len(self.workers) > size:
            worker = self.workers.pop()
            worker.stopping = True
            if not worker.busy and worker.task is not None:
                worker.task.cancel()  # waiting in ready(): takes no job when cancelled

    async def submit(self, fn: Job) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.dispatcher.submit(_Job(fn, fut))
        return await fut

    async def _work(self, worker: _CellWorker) -> None:
        timeout_s = self.job_timeout_s
        this = asyncio.current_task()
        while not worker.stopping:
            # A job that caught the close's cancel and returned ends the loop above
            # (close marks its workers stopping); a count without a stop is taken back.
            raise_swallowed_cancel(this, worker.stopping)
            job = await self.dispatcher.ready()
            worker.busy = True
            try:
                if job.fut.done():
                    continue
                started = time.monotonic()
                try:
                    async with asyncio.timeout(timeout_s):  # wait_for can lose a cancel
                        result = await job.fn()
                except TimeoutError:
                    self.timed_out += 1
                    if not job.fut.done():
                        job.fut.set_exception(CellJobTimeout(
                            f"cell {self.name!r}: job ran longer than {timeout_s}s "
                            f"(gave up after {time.monotonic() - started:.1f}s)"
                        ))
                except asyncio.CancelledError as exc:
                    if this is None or this.cancelling():  # the cell closing, or shrinking
                        if not job.fut.done():
                            job.fut.cancel()
                        raise
                    # Raised by the job, not sent to this task: its call's failure, as in
                    # a handler outside a cell. Raised on, it ended this worker: the
                    # cell's later jobs waited for ever.
                    if not job.fut.done():
                        job.fut.set_exception(exc)
                except BaseException as exc:  # a BaseException of the app's own, or a
                    # KeyboardInterrupt or SystemExit: the caller's chain judges it (a
                    # failure, or a stop), as for a handler outside a cell
                    if not job.fut.done():
                        job.fut.set_exception(exc)
                else:
                    self.handled += 1
                    if not job.fut.done():
                        job.fut.set_result(result)
            finally:
                worker.busy = False

    async def close(self) -> None:
        tasks = [w.task for w in self.workers if w.task is not None]
        for worker in self.workers:
            worker.stopping = True  # one whose job swallows the cancel ends when it returns
        self.workers.clear()
        for job in self.dispatcher.pending:
            job.fut.cancel()
        await cancel_and_wait(*tasks)


def parse_cell_key(spec: str) -> tuple[str, str]:
    """``"header:tenant"`` / ``"body:tenant"`` -> (source, name); InvalidArgumentError otherwise."""
    source, sep, name = spec.partition(":")
    if not sep or source not in ("header", "body") or not name:
        raise InvalidArgumentError(f"cell_key must be 'header:NAME' or 'body:NAME', got {spec!r}")
    return source, name


class CellRouter:
    """All the cells of one handler; cells are created on a key's first message.

    ``sizes`` maps a cell name to its size; other cells get ``default_size``. Both can
    be changed while running with :meth:`resize`.
    """

    def __init__(
        self,
        handler: str,
        default_size: int,
        sizes: Mapping[str, int] | None = None,
        job_timeout_s: float | None = None,
    ) -> None:
        self.handler = handler
        self.default_size = default_size
        self.sizes = dict(sizes or {})
        self.job_timeout_s = job_timeout_s
        self.cells: dict[str, Cell] = {}

    def cell(self, name: str) -> Cell:
        cell = self.cells.get(name)
        if cell is None:
            size = self.sizes.get(name, self.default_size)
            cell = self.cells[name] = Cell(name, size, self.job_timeout_s)
        return cell

    def resize(self, name: str, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            # Checked before it is stored: a cell not yet created would otherwise fail
            # on its first message, and that message's retries would dead-letter it.
            raise InvalidArgumentError(
                f"cell {self.handler}/{name}: size must be an int >= 1, got {size!r}"
            )
        self.sizes[name] = size
        if name in self.cells:
            self.cells[name].resize(size)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per cell: size, busy workers, queue length (metrics)."""
        return {
            n: {"size": c.size, "busy": c.busy, "queue_length": c.queue_length}
            for n, c in self.cells.items()
        }

    async def close(self) -> None:
        for cell in self.cells.values():
            await cell.close()
        self.cells.clear()
