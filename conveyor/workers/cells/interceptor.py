"""Cells as a step of the delivery chain (handlers declared with ``cell_key=``).

Each message's cell is named by a header (``cell_key="header:tenant"``) or a field of
its decoded body (``"body:tenant"``; a Struct attribute or dict key); messages without
it go to the cell ``_default``. The rest of the chain runs as a job in that cell
(:class:`~conveyor.workers.cells.cells.CellRouter`); a job that outlives
``cell_job_timeout_s`` fails with :class:`~conveyor.workers.cells.cells.CellJobTimeout`,
which retry sees like any handler error. Absent from other handlers' chains.

Sizes: the handler's ``cell_size``/``cell_sizes``, overridden by ``[cells]`` in the
config (``default_size``; ``sizes`` by cell name, or ``handler-name/cell`` for one
handler).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from conveyor.platform.delivery import Delivery, Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.options import CellOptions
from conveyor.workers.cells.cells import DEFAULT_CELL, CellRouter


def cell_reader(options: CellOptions) -> Callable[[Delivery], str]:
    """How a delivery names its cell."""
    name = options.name
    if options.source == "header":
        return lambda delivery: delivery.message.headers.get(name) or DEFAULT_CELL

    def from_body(delivery: Delivery) -> str:
        body = delivery.body
        value = body.get(name) if isinstance(body, dict) else getattr(body, name, None)
        return DEFAULT_CELL if value is None else str(value)

    return from_body


class CellInterceptor(Interceptor):
    options = CellOptions

    def __init__(
        self, sizes: Mapping[str, int] | None = None, default_size: int | None = None
    ) -> None:
        self._sizes = dict(sizes or {})
        self._default_size = default_size
        self.routers: dict[str, CellRouter] = {}
        """Handler name -> its cells (metrics, ``WorkerDaemon.resize_cell``)."""

    def _sizes_for(self, handler: str) -> dict[str, int]:
        return {
            key.split("/", 1)[-1]: size for key, size in self._sizes.items()
            if "/" not in key or key.startswith(handler + "/")
        }

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        options = handler.option(CellOptions)
        if options is None:
            return next
        router = self.routers[handler.name] = CellRouter(
            handler.name,
            self._default_size or options.size,
            {**options.sizes, **self._sizes_for(handler.name)},
            options.job_timeout_s,
        )
        cell_of = cell_reader(options)
        cells = router.cells
        cell = router.cell

        def in_cell(delivery: Delivery) -> Awaitable[Any]:
            name = cell_of(delivery)
            target = cells.get(name) or cell(name)
            return target.submit(lambda: next(delivery))

        return in_cell

    async def close(self) -> None:
        for router in self.routers.values():
            await router.close()
