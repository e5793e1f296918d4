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

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from conveyor.platform.delivery import Delivery, Interceptor, Step
from conveyor.platform.errors import ConfigError
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.options import CellOptions
from conveyor.workers.cells.cells import DEFAULT_CELL, CellRouter

log = logging.getLogger("conveyor.cells")


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

    def check_sizes(self, slots: int | None) -> None:
        """After every handler is wrapped: refuse ``[cells] sizes`` keys
        ``handler-name/cell`` naming a handler without cells (a typo would leave the
        cell at its default size without a word), and warn when the named cells' sizes
        add up past ``slots`` (the fixed supplier's count; ``None``: not known)."""
        for key in sorted(self._sizes):
            handler, sep, _ = key.partition("/")
            if sep and handler not in self.routers:
                raise ConfigError(
                    f"$.cells.sizes: {key!r} names handler {handler!r}, which has no cells "
                    f"(handlers with cells: {', '.join(sorted(self.routers)) or 'none'})"
                )
        reserved = {
            f"{h}/{cell}": size for h, router in self.routers.items()
            for cell, size in router.sizes.items()
        }
        if slots is not None and sum(reserved.values()) > slots:
            log.warning(
                "cells: the sizes of the named cells add up to %d workers (%s) but "
                "$.slots.count is %d: at most %d handler calls run at once, so the cells "
                "cannot all use their workers; raise $.slots.count (docs/workers.md, Cells)",
                sum(reserved.values()),
                ", ".join(f"{k}={v}" for k, v in sorted(reserved.items())), slots, slots,
            )

    async def close(self) -> None:
        for router in self.routers.values():
            await router.close()
