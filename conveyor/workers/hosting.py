"""Hooking pools and cells into delivery without touching the agent or the runtime.

For a handler declared ``stateless=True`` or with ``cell_key=``, the daemon replaces
its :class:`HandlerSpec` by one whose ``fn`` submits the real call to the handler's
pool or cell and awaits the result. Everything else is unchanged: the runtime still
decodes, retries (each retry is a new submission) and dead-letters; a cell job's
timeout raises :class:`~conveyor.workers.cells.CellJobTimeout` into that same path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from conveyor.platform.handlers import HandlerSpec, MessageContext
from conveyor.workers.cells import DEFAULT_CELL, CellRouter, parse_cell_key
from conveyor.workers.pool import StatelessWorkerPool
from conveyor.workers.scaledown import ScaleDownPolicy

DEFAULT_CELL_SIZE = 4


def scale_down_policy(option: Any) -> ScaleDownPolicy | None:
    if option is None or option is False:
        return None
    if option is True:
        return ScaleDownPolicy()
    if isinstance(option, ScaleDownPolicy):
        return option
    raise TypeError(f"scale_down must be True, False or a ScaleDownPolicy, got {option!r}")


def host_pool(spec: HandlerSpec) -> tuple[HandlerSpec, StatelessWorkerPool]:
    opts = spec.options
    pool = StatelessWorkerPool(
        spec.name, opts.get("max_workers"), scale_down_policy(opts.get("scale_down"))
    )
    fn = spec.fn
    run = pool.run
    if spec.takes_context:
        async def submit_ctx(arg: Any, ctx: MessageContext) -> Any:
            return await run(lambda: fn(arg, ctx))
        return dataclasses.replace(spec, fn=submit_ctx), pool

    async def submit(arg: Any) -> Any:
        return await run(lambda: fn(arg))
    return dataclasses.replace(spec, fn=submit), pool


def _cell_of(source: str, name: str) -> Any:
    if source == "header":
        def from_header(arg: Any, ctx: MessageContext) -> str:
            return ctx.message.headers.get(name) or DEFAULT_CELL
        return from_header

    def from_body(arg: Any, ctx: MessageContext) -> str:
        value = arg.get(name) if isinstance(arg, dict) else getattr(arg, name, None)
        return DEFAULT_CELL if value is None else str(value)
    return from_body


def host_cells(
    spec: HandlerSpec, sizes: Mapping[str, int] | None = None, default_size: int | None = None
) -> tuple[HandlerSpec, CellRouter]:
    """``sizes`` (from config) override the handler's ``cell_sizes`` option."""
    opts = spec.options
    source, field = parse_cell_key(opts["cell_key"])
    merged = {**opts.get("cell_sizes", {}), **(sizes or {})}
    router = CellRouter(
        spec.name,
        default_size or opts.get("cell_size", DEFAULT_CELL_SIZE),
        merged,
        opts.get("cell_job_timeout_s"),
    )
    fn = spec.fn
    takes_context = spec.takes_context
    cell_of = _cell_of(source, field)
    cells = router.cells
    cell = router.cell

    async def submit(arg: Any, ctx: MessageContext) -> Any:
        name = cell_of(arg, ctx)
        target = cells.get(name) or cell(name)
        if takes_context:
            return await target.submit(lambda: fn(arg, ctx))
        return await target.submit(lambda: fn(arg))

    # The router needs the context (headers) even when the user's handler does not.
    return dataclasses.replace(spec, fn=submit, takes_context=True), router
