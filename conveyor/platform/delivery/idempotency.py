"""Effectively-once handlers: ``@app.handler(ns, idempotent=True)``.

At least once means a message can come again — after a crash, a lost lease, a drain
that timed out, a rewind or a replay — and every user then writes the same dedupe code.
This interceptor writes it once, keyed by the message id (``cv-id``) and the handler's
name, in a store every daemon of the app shares (Redis on Redis and Kafka deployments,
in-process on the embedded adapter):

1. **Claim** the id before the handler runs. One call answers: *claimed* (run it),
   *done* (completed within the window: acknowledge without running; counted as
   ``deduplicated``), or *busy* (another delivery of the id runs right now, here or in
   another daemon: wait until it is done or its claim lapses). So two deliveries of one
   id never run at once. A claim lasts ``claim_s`` and is renewed while the handler
   runs; a daemon that dies holding one lets it lapse after at most ``claim_s``.
2. Run the rest of the chain (retries included: the claim covers every attempt).
3. **Complete**: mark the id done for ``window_s``, then return, so the message is
   acknowledged only after the mark. If the handler fails for good the claim is
   released and the message goes on to the dead-letter step; a replay runs it again.

**The window that remains.** A delivery that ran the handler to its end but died (or
lost its store) before the completion mark landed is run again by the next delivery:
that window is the handler's return to the store's acknowledgement of the mark, one
round trip (about 0.1 to 0.3 ms to a local Redis). A delivery paused (SIGSTOP, a long GC)
for longer than ``claim_s`` while its handler runs can see its claim lapse and another
delivery start; keep ``claim_s`` above the longest pause you want covered. Outside
those two windows a completed id never runs again while its mark lasts (``window_s``).

The store is asked with back-off until it answers: while it is down nothing runs (a
handler is never started without a claim) and nothing is dead-lettered for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from conveyor.platform.backoff import Backoff
from conveyor.platform.delivery.chain import Delivery, DeliveryStats, Interceptor, Step
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.options import IdempotencyOptions
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.idempotency")


class Claim(enum.Enum):
    CLAIMED = "claimed"
    DONE = "done"
    BUSY = "busy"


class IdempotencyStore(Protocol):
    """Where claims and completion marks live (one namespace per app)."""

    async def claim(self, key: str, owner: str, claim_s: float) -> tuple[Claim, float]:
        """Claim ``key`` for ``owner``; with BUSY, how long the other claim may still last."""
        ...

    async def renew(self, key: str, owner: str, claim_s: float) -> bool: ...

    async def complete(self, key: str, window_s: float) -> None: ...

    async def release(self, key: str, owner: str) -> None: ...

    async def close(self) -> None: ...


class LocalIdempotencyStore:
    """Claims and marks in this process (the embedded adapter), at most ``max_keys`` of
    them: past it the oldest marks go first (an id older than that may run again)."""

    _by_broker: dict[str, LocalIdempotencyStore] = {}

    def __init__(self, max_keys: int = 1_000_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_keys = max_keys
        self._clock = clock
        self._keys: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()

    @classmethod
    def shared(cls, name: str) -> LocalIdempotencyStore:
        """One store per in-process broker name: daemons sharing a broker share it."""
        store = cls._by_broker.get(name)
        if store is None:
            store = cls._by_broker[name] = cls()
        return store

    def _get(self, key: str) -> tuple[str, float] | None:
        entry = self._keys.get(key)
        if entry is not None and entry[1] <= self._clock():
            del self._keys[key]
            return None
        return entry

    def _set(self, key: str, value: str, ttl_s: float) -> None:
        self._keys[key] = (value, self._clock() + ttl_s)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    async def claim(self, key: str, owner: str, claim_s: float) -> tuple[Claim, float]:
        entry = self._get(key)
        if entry is None or entry[0] == owner:
            self._set(key, owner, claim_s)
            return Claim.CLAIMED, 0.0
        if entry[0] == "":
            return Claim.DONE, 0.0
        return Claim.BUSY, entry[1] - self._clock()

    async def renew(self, key: str, owner: str, claim_s: float) -> bool:
        entry = self._get(key)
        if entry is None or entry[0] != owner:
            return False
        self._set(key, owner, claim_s)
        return True

    async def complete(self, key: str, window_s: float) -> None:
        self._set(key, "", window_s)  # "" marks done (owners are never empty)

    async def release(self, key: str, owner: str) -> None:
        entry = self._get(key)
        if entry is not None and entry[0] == owner:
            del self._keys[key]

    async def close(self) -> None:
        return None


BUSY_POLL_MAX_S = 0.5
"""Longest wait between two looks at an id another delivery is running."""


class IdempotencyInterceptor(Interceptor):
    """Step 4½ of the chain (after decode, around retry) for ``idempotent=True``
    handlers; absent from every other chain."""

    options = IdempotencyOptions

    def __init__(self, store: IdempotencyStore, stats: DeliveryStats) -> None:
        self.store = store
        self.stats = stats
        self._owner_prefix = uuid.uuid4().hex[:12]
        self._owners = itertools.count(1)
        self._backoff = Backoff(first_s=0.05, cap_s=2.0)
        self._log = ThrottledLog(log, interval_s=30.0)
        self._renewing: dict[str, asyncio.Task[None]] = {}  # by claim owner
        self._releasing: set[asyncio.Task[None]] = set()

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        options = handler.option(IdempotencyOptions)
        if options is None:
            return next
        store, stats, name = self.store, self.stats, handler.name
        claim_s, window_s = options.claim_s, options.window_s

        async def once(delivery: Delivery) -> Any:
            key = f"{name}:{delivery.message.id}"
            owner = self._new_owner()
            while True:
                state, wait_s = await self._ask(lambda: store.claim(key, owner, claim_s))
                if state is Claim.CLAIMED:
                    break
                if state is Claim.DONE:
                    stats.deduplicated += 1
                    return None
                await asyncio.sleep(min(max(wait_s, 0.01), BUSY_POLL_MAX_S))
            renewing = asyncio.get_running_loop().call_later(
                claim_s / 3, self._start_renewing, key, owner, claim_s)
            try:
                result = await next(delivery)
            except BaseException:
                renewing.cancel()
                self._stop_renewing(owner)
                self._release_soon(key, owner)
                raise
            renewing.cancel()
            self._stop_renewing(owner)
            await self._ask(lambda: store.complete(key, window_s))
            return result

        return once

    def _new_owner(self) -> str:
        """A claim owner unique to one delivery (this daemon's prefix, a counter)."""
        return f"{self._owner_prefix}-{next(self._owners)}"

    async def _ask(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()``, again with back-off until the store answers (cancellable)."""
        failures = 0
        while True:
            try:
                return await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._log.log(logging.WARNING, type(exc).__name__,
                              "idempotency store unavailable (%s); no idempotent handler "
                              "starts or completes until it answers", exc)
                await asyncio.sleep(self._backoff.delay(failures))

    def _start_renewing(self, key: str, owner: str, claim_s: float) -> None:
        """The handler has run a third of ``claim_s``: keep its claim alive until it ends."""
        task = asyncio.get_running_loop().create_task(self._renew(key, owner, claim_s))
        self._renewing[owner] = task

    def _stop_renewing(self, owner: str) -> None:
        task = self._renewing.pop(owner, None)
        if task is not None:
            task.cancel()

    async def _renew(self, key: str, owner: str, claim_s: float) -> None:
        while True:
            with contextlib.suppress(Exception):  # a miss is retried a third of a claim on
                if not await self.store.renew(key, owner, claim_s):
                    log.warning("claim of %s lapsed while its handler ran (longer than "
                                "idempotency_claim_s without a renewal)", key)
                    return
            await asyncio.sleep(claim_s / 3)

    def _release_soon(self, key: str, owner: str) -> None:
        """Give the claim back (the handler failed or was cancelled), without waiting:
        the next delivery need not wait ``claim_s`` for it to lapse."""
        async def release() -> None:
            with contextlib.suppress(Exception):
                await self.store.release(key, owner)

        task = asyncio.get_running_loop().create_task(release())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def close(self) -> None:
        """Stop renewing, let pending releases reach the store (1 s at most), close it."""
        for task in self._renewing.values():
            task.cancel()
        self._renewing.clear()
        if self._releasing:
            await asyncio.wait(list(self._releasing), timeout=1.0)
        await self.store.close()
