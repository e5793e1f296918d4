"""Stateless-worker pools as a step of the delivery chain (``stateless=True`` handlers).

The rest of the chain — the app's interceptors are outside it, the handler call inside
— runs as a job on the handler's :class:`~conveyor.workers.pools.pool.StatelessWorkerPool`.
Retry is outside too, so each attempt is a new submission. Absent from the chains of
handlers without ``stateless=True``.
"""

from __future__ import annotations

from conveyor.platform.delivery import Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.options import PoolOptions
from conveyor.workers.pools.pool import StatelessWorkerPool


class PoolInterceptor(Interceptor):
    options = PoolOptions

    def __init__(self) -> None:
        self.pools: dict[str, StatelessWorkerPool] = {}
        """Handler name -> its pool (metrics read the gauges)."""

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        options = handler.option(PoolOptions)
        if options is None:
            return next
        pool = self.pools[handler.name] = StatelessWorkerPool(
            handler.name, options.max_workers, options.scale_down
        )
        run = pool.run
        return lambda delivery: run(lambda: next(delivery))

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()

