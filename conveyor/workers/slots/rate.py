"""Rate-limited slots: handler starts per second, per daemon or shared by a whole app.

``[slots.rate] per_second = R, burst = B`` wraps the daemon's slot supplier in a
:class:`RateLimitedSlotSupplier`: a handler call starts only with a slot of the inner
supplier (concurrency, as before) *and* a token from a rate limiter. Tokens follow the
generic cell rate algorithm (GCRA, a token bucket kept as one timestamp, the
"theoretical arrival time"): one token every ``1/R`` seconds, up to ``B`` at once after
an idle spell, so in any window of ``T`` seconds at most ``R·T + B`` calls start.

Where the limiter lives (``store``):

* ``"redis"`` — one key in Redis (``PREFIX:app:APP:rate`` at ``[redis] url``), updated by one
  Lua script per grant, so every daemon of the app, on any machine, draws from the same
  bucket: ten daemons at 100/s start 100 calls a second between them, not 1,000. The
  script reads Redis' own clock, so daemons' clocks need not agree.
* ``"local"`` — the same algorithm in the daemon's process (a per-daemon limit).

Round trips stay off the hot path of an unlimited worker (no ``[slots.rate]``: no
wrapper at all) and are batched in a limited one: a single grant task per daemon asks
for as many tokens as it has waiting reservations and hands them out in order; when the
bucket is empty it sleeps until the next token is due, as the script tells it.

Failing safe: while Redis cannot be reached no token is granted (handlers already
running finish; nothing new starts), the outage is logged once when it begins and once
when it ends, and grants resume with Redis. A token granted to a reservation that was
then not used (the runner found no work, or was cancelled) is kept for the next
reservation for one token interval, so the rate is not lost to bookkeeping, and is
dropped after that, so the ``R·T + B`` bound holds within one token.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from conveyor.platform.backoff import Backoff
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.slots import (
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
    TokenSource,
)
from conveyor.platform.throttled_log import ThrottledLog
from conveyor.workers.slots.wrappers import DelegatingSlotSupplier

log = logging.getLogger("conveyor.slots")

MIN_SLEEP_S = 0.001
"""Shortest wait before asking again for a token that is not due yet."""


class Gcra:
    """The generic cell rate algorithm on a clock of seconds (the Redis script runs the
    same arithmetic in microseconds on the server's clock).

    ``tat`` is the theoretical arrival time of the next token. A request of ``k`` tokens
    at ``now`` is granted as far as ``tat + (k-1)·interval - now ≤ tolerance``, where
    ``tolerance = (burst-1)·interval``: after an idle spell ``burst`` tokens at once,
    then one per ``interval``.
    """

    def __init__(self, per_second: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_second <= 0 or burst < 1:
            raise InvalidArgumentError("per_second must be > 0 and burst >= 1")
        self.interval = 1.0 / per_second
        self.tolerance = (burst - 1) * self.interval
        self._clock = clock
        self._tat = 0.0

    def take_now(self, want: int) -> tuple[int, float]:
        now = self._clock()
        tat = max(self._tat, now)
        room = self.tolerance - (tat - now)
        granted = min(want, int(room / self.interval + 1e-9) + 1) if room >= -1e-12 else 0
        if granted > 0:
            self._tat = tat + granted * self.interval
            return granted, 0.0
        return 0, tat - self.tolerance - now

    async def take(self, want: int) -> tuple[int, float]:
        return self.take_now(want)

    async def close(self) -> None:
        return None


class RateLimitedSlotSupplier(DelegatingSlotSupplier):
    """Wraps any supplier: a permit is granted with an inner permit *and* a token.

    ``reserve_slot`` takes the inner permit first (the concurrency bound), then waits for
    a token. ``try_reserve_slot`` succeeds only with a spare token at hand, so a runner
    normally waits in ``reserve_slot``. ``keep_slot`` is never true: every handler call
    needs its own token. ``waiting`` (reservations waiting for a token) and ``granted``
    (tokens handed out) are there for metrics and tests.
    """

    def __init__(self, inner: SlotSupplier, source: TokenSource, *, per_second: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(inner)
        self.source = source
        self.per_second = per_second
        """The limit, as configured (published with the daemon's heartbeat)."""
        self.granted = 0
        self._clock = clock
        self._spare_ttl_s = 1.0 / per_second
        self._spare: collections.deque[float] = collections.deque()  # expiry times
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._granter: asyncio.Task[None] | None = None
        self._backoff = Backoff(first_s=0.05, cap_s=1.0)
        self._log = ThrottledLog(log, interval_s=30.0)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    @property
    def available(self) -> int | None:
        inner = self.inner.available
        return None if inner is None else min(inner, self._spares())

    def keep_slot(self, permit: SlotPermit) -> bool:
        return False

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        inner = await self.inner.reserve_slot(ctx)
        try:
            await self._token()
        except BaseException:
            inner.release(SlotReleaseReason.NEVER_USED)
            raise
        return self._wrap(inner)

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        if not self._spares():
            return None
        inner = self.inner.try_reserve_slot(ctx)
        if inner is None:
            return None
        self._spare.popleft()
        return self._wrap(inner)

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        super().release_slot(reason, permit)
        if reason is SlotReleaseReason.NEVER_USED:
            self._give_back()

    async def close(self) -> None:
        if self._granter is not None:
            self._granter.cancel()
            await asyncio.gather(self._granter, return_exceptions=True)
            self._granter = None
        await self.source.close()
        await super().close()

    # -- tokens -------------------------------------------------------------------------
    def _spares(self) -> int:
        now = self._clock()
        spare = self._spare
        while spare and spare[0] <= now:
            spare.popleft()  # kept too long: dropping it keeps the R·T + B bound
        return len(spare)

    def _give_back(self) -> None:
        """A granted token went unused: the next reservation may have it, for a while."""
        self._spare.append(self._clock() + self._spare_ttl_s)
        self._serve_spares()

    def _serve_spares(self) -> None:
        while self._waiters and self._spares():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._spare.popleft()
                waiter.set_result(None)

    async def _token(self) -> None:
        if self._spares():
            self._spare.popleft()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._granter is None or self._granter.done():
            self._granter = asyncio.create_task(self._grant_loop())
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back()  # granted just as the reservation was cancelled
            else:
                waiter.cancel()
            raise

    async def _grant_loop(self) -> None:
        failures = 0
        while True:
            while self._waiters and self._waiters[0].done():
                self._waiters.popleft()  # cancelled reservations
            want = self.waiting
            if want == 0:
                self._granter = None
                return
            try:
                granted, wait_s = await self.source.take(want)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # fail safe: no grants until the store answers
                failures += 1
                self._log.log(logging.WARNING, "take", "rate limiter: no tokens while its "
                              "store fails (%s); handlers start again when it answers", exc)
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            if failures:
                log.info("rate limiter: its store answers again; granting tokens")
                failures = 0
            self.granted += granted
            for _ in range(granted):
                while self._waiters and self._waiters[0].done():
                    self._waiters.popleft()
                if not self._waiters:
                    self._give_back()
                    continue
                self._waiters.popleft().set_result(None)
            if granted < want:
                await asyncio.sleep(max(wait_s, MIN_SLEEP_S))
