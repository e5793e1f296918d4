"""Queue balancers: which daemon pulls which queue.

``StaticBalancer``
    A fixed list of queues, owned without leases (one daemon, or a hand-made split).
``DynamicBalancer``
    Daemons register in a :class:`Membership`; each computes the same split of the
    queues from the same view — the live members and the current lease holders — and
    takes its share through leases (:mod:`conveyor.platform.balancing.leases`). The default split
    is sticky (:func:`sticky_split`): a daemon keeps what it holds up to its fair share,
    so a join or a leave moves only the surplus. When a daemon joins or leaves, the giving side
    drains the queue (stops pulling, finishes and acknowledges in-flight messages) and
    only then releases the lease; the taking side starts once it can acquire it. A dead
    daemon's leases simply expire and are taken over; its unacknowledged messages are
    redelivered by the queue.

Two tasks run per dynamic balancer: one renews leases (every ``ttl/3``) and reports a
lease as lost once its local deadline, less a safety margin, has passed without a
renewal; the other re-balances on membership events, lease releases, or every
``rebalance_interval_s``. They are separate so a long drain never delays a renewal.

**A blocked event loop costs no lease.** Given ``keeper_stores`` (a factory of a second
membership and lease store), the renewals and membership heartbeats run on a
:class:`~conveyor.platform.balancing.keeper.Keeper` thread with those stores, so a handler that
blocks the daemon's loop does not stop them. They go on only while the loop's stall
(:meth:`LoopWatchdog.stall_s`) stays below the lease's tolerance (``ttl - margin``): a
longer stall stops the renewals, the leases lapse and are reported lost, and the queues
go to another daemon — which counts a delivery against every message it takes over, so a
message that stalls every worker ends as a dead letter (``max_deliveries``) instead of
looping. Acquiring, releasing and re-balancing stay on the daemon's loop.

A queue whose start fails (the listener raises: the broker stayed unreachable, the
lease moved while the previous owner's entries were being claimed...) is not kept:
its lease is released and a later re-balance takes it again, after a back-off that
doubles per consecutive failure (from ``rebalance_interval_s`` up to the lease TTL).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from conveyor.platform.backoff import Backoff
from conveyor.platform.balancing.keeper import Keeper
from conveyor.platform.balancing.leases import Lease, LeaseStore, MemoryLeaseStore
from conveyor.platform.balancing.membership import (
    MemberInfo,
    Membership,
    MemoryMembership,
    timer_phase,
)
from conveyor.platform.balancing.placement import PlacementWeights, resource_split
from conveyor.platform.deadlines import StallTolerantTimeout
from conveyor.platform.errors import BrokerConnectionError, StoreUnfitError, error_text
from conveyor.platform.throttled_log import EpisodeLog, ThrottledLog
from conveyor.platform.watchdog import LoopWatchdog

log = logging.getLogger("conveyor.balancer")

FULL_RECHECK_INTERVALS = 30
"""A settled dynamic balancer re-balances in full at least every 30-60 intervals."""


def best_fit(member_ids: Sequence[str], total_queues: int) -> dict[str, list[int]]:
    """Split queues ``0..total_queues-1`` as evenly as possible, deterministically.

    Members are taken in sorted order and dealt queues round-robin, so every member
    gets ``floor(q/n)`` or ``ceil(q/n)`` queues and every daemon that sees the same
    member list computes the same split.
    """
    members = sorted(member_ids)
    split: dict[str, list[int]] = {m: [] for m in members}
    if not members:
        return split
    for queue in range(total_queues):
        split[members[queue % len(members)]].append(queue)
    return split


def sticky_split(
    member_ids: Sequence[str], total_queues: int, owners: Mapping[int, str]
) -> dict[str, list[int]]:
    """Split queues ``0..total_queues-1`` evenly, moving as few as possible from ``owners``.

    Every member gets ``floor(q/n)`` or ``ceil(q/n)`` queues. The ``q mod n`` larger
    shares go to the members holding the most now (ties: the smaller id), each member
    keeps its lowest-numbered queues up to its share, and the rest — the surplus, plus
    queues held by no live member — are dealt in queue order to the members short of
    their share, in id order. No even split keeps more queues where they are: a queue
    moves only if its owner holds more than its share, or is gone.

    A pure function of its arguments: every daemon that reads the same members and lease
    holders computes the same split (holders that are not members count as nobody).
    """
    members = sorted(set(member_ids))
    if not members:
        return {}
    held: dict[str, list[int]] = {m: [] for m in members}
    unheld: list[int] = []
    for queue in range(total_queues):
        mine = held.get(owners.get(queue, ""))
        (unheld if mine is None else mine).append(queue)
    base, larger = divmod(total_queues, len(members))
    by_holding = sorted(members, key=lambda m: (-len(held[m]), m))
    share = {m: base + (i < larger) for i, m in enumerate(by_holding)}
    split = {m: held[m][: share[m]] for m in members}
    free = sorted(unheld + [q for m in members for q in held[m][share[m]:]])
    at = 0
    for m in members:
        wanted = share[m] - len(split[m])
        split[m] = sorted(split[m] + free[at:at + wanted])
        at += wanted
    return split


class Placement(ABC):
    """How a dynamic balancer splits the queues among the live members."""

    needs_owners = False
    """Whether :meth:`split` looks at the current owners (costs one store read)."""

    needs_stats = True
    """Whether :meth:`split` looks at more than the members' ids (their statistics).
    Such a split can change while the members stay the same, so it is recomputed every
    re-balance interval, from the full records; a split of ids alone (``False``) only
    when the members change or a daemon is short of its share. True unless a placement
    says otherwise: the careful default for one written later."""

    @abstractmethod
    def split(
        self, members: Sequence[MemberInfo], total_queues: int, owners: Mapping[int, str]
    ) -> dict[str, list[int]]: ...


class BestFitPlacement(Placement):
    """Even and sticky: everyone gets floor(q/n) or ceil(q/n), keeping what it holds
    (:func:`sticky_split`), so a membership change moves only the surplus."""

    needs_owners = True
    needs_stats = False

    def split(
        self, members: Sequence[MemberInfo], total_queues: int, owners: Mapping[int, str]
    ) -> dict[str, list[int]]:
        return sticky_split([m.id for m in members], total_queues, owners)


class ResourcePlacement(Placement):
    """Power-of-K choices over the CPU and memory statistics members publish."""

    needs_owners = True
    needs_stats = True

    def __init__(self, weights: PlacementWeights | None = None) -> None:
        self.weights = weights or PlacementWeights()

    def split(
        self, members: Sequence[MemberInfo], total_queues: int, owners: Mapping[int, str]
    ) -> dict[str, list[int]]:
        return resource_split({m.id: m.stats for m in members}, total_queues, owners,
                              self.weights)


class BalanceListener(Protocol):
    """What a balancer tells its daemon. Calls for one queue never overlap."""

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        """Start pulling ``queue``."""

    async def queue_released(self, queue: int) -> None:
        """Stop pulling ``queue`` gracefully: drain and acknowledge, then return."""

    async def queue_lost(self, queue: int) -> None:
        """The lease is gone: stop at once and acknowledge nothing more."""

    def balancer_failed(self, error: BaseException) -> None:
        """The balancer can never give this daemon a queue again (e.g. a group join
        that failed for good after the daemon started): the daemon should stop."""


class QueueBalancer(ABC):
    @abstractmethod
    async def start(self, member: MemberInfo, listener: BalanceListener) -> None: ...

    @abstractmethod
    async def stop(self) -> None:
        """Release every queue gracefully (through the listener) and leave."""

    @abstractmethod
    def owned(self) -> list[int]: ...

    def owned_until(self, queue: int) -> float:
        """Until when (``time.monotonic()``) this daemon may act on ``queue`` — start a
        handler, pull, acknowledge; ``-inf`` if it is not its. Agents cache the answer and
        compare the clock against it before every handler start, asking again only once
        it has passed, so a balancer may extend a deadline it gave but never shorten it:
        it takes a queue away by calling the listener (``queue_released``/``queue_lost``)."""
        return math.inf

    def lease_valid(self, queue: int) -> bool:
        """May this daemon still act on ``queue``? (fencing, checked before pulls and acks)."""
        return time.monotonic() < self.owned_until(queue)

    def joined(self) -> bool:
        """Has the daemon joined what shares the queues (its membership, its consumer
        group) since :meth:`start`, so that its share is held or being taken? Read by
        ``/readyz``; a balancer that shares with nobody is joined once started."""
        return True

    def set_stats_provider(self, provider: StatsProvider) -> None:  # noqa: B027
        """Stats to publish with this daemon's membership record (ignored when static)."""

    def set_app(self, handlers: Sequence[str], namespaces: Sequence[str]) -> None:  # noqa: B027
        """The app's handler names and namespaces, for a balancer that can tell members
        of another app under the same name apart (``kafka-group``); ignored elsewhere."""


StatsProvider = Callable[[], dict[str, float]]


class StaticBalancer(QueueBalancer):
    def __init__(self, queues: Iterable[int]) -> None:
        self._queues = sorted(set(queues))
        self._listener: BalanceListener | None = None

    async def start(self, member: MemberInfo, listener: BalanceListener) -> None:
        self._listener = listener
        for queue in self._queues:
            await listener.queue_acquired(queue, None)

    async def stop(self) -> None:
        if self._listener is not None:
            await asyncio.gather(*(self._listener.queue_released(q) for q in self._queues))
            self._listener = None

    def owned(self) -> list[int]:
        return list(self._queues) if self._listener else []


TASKS_STOP_S = 5.0
"""How long a stopping balancer waits for its renew, balance and heartbeat loops to end."""


class DynamicBalancer(QueueBalancer):
    def __init__(
        self,
        membership: Membership,
        leases: LeaseStore,
        total_queues: int,
        *,
        lease_ttl_s: float = 5.0,
        rebalance_interval_s: float = 1.0,
        placement: Placement | None = None,
        clock: Callable[[], float] = time.monotonic,
        keeper_stores: Callable[[], tuple[Membership, LeaseStore]] | None = None,
        watchdog: LoopWatchdog | None = None,
    ) -> None:
        self.membership = membership
        # The lease store's clock (a simulation passes its virtual one).
        self._clock = clock
        self.placement = placement or BestFitPlacement()
        self.leases = leases
        self.total_queues = total_queues
        self.lease_ttl_s = lease_ttl_s
        self.rebalance_interval_s = rebalance_interval_s
        # Stop acting on a lease this long before it would expire in the store.
        self.safety_margin_s = lease_ttl_s / 5
        self._held: dict[int, Lease] = {}
        self._member: MemberInfo | None = None
        self._listener: BalanceListener | None = None
        self._tasks: list[asyncio.Future[None]] = []
        self._stopping = False
        self._queue_locks: dict[int, asyncio.Lock] = {}
        self._stats: StatsProvider | None = None
        # queue -> (consecutive failed starts, monotonic time before which not to retry)
        self._failed_starts: dict[int, tuple[int, float]] = {}
        self._start_backoff = Backoff(first_s=rebalance_interval_s, cap_s=lease_ttl_s)
        self._joined = False
        # What the last re-balance aimed at; the membership version and lease generation
        # it read, kept only if it found every queue where its split put it.
        self._target: set[int] | None = None
        self._split_marks: tuple[int | None, int | None] | None = None
        self._full_due = 0.0  # when a settled daemon re-balances in full anyway
        self._unreachable = ThrottledLog(log, interval_s=30.0)
        self._unfit = EpisodeLog(log, "re-balance failed")
        """The store's fault met by the balance loop (:class:`StoreUnfitError`): said
        once, not every interval."""
        self._unfit_leases: set[int] = set()
        """Queues whose lease could not be taken for a key of another type (said once)."""
        # Liveness off the loop (see the module's docstring): where renewals and
        # heartbeats go — the keeper's own stores, or these when there is no keeper.
        self._keeper_stores = keeper_stores
        self._keeper: Keeper | None = None
        self._live_membership = membership
        self._live_leases = leases
        self._watchdog = watchdog
        self._stall_limit_s = lease_ttl_s - self.safety_margin_s
        self._stall_reported = False
        self._stall_left = False
        self._main_loop: asyncio.AbstractEventLoop | None = None
        # _held is written by both loops: a check-then-set holds this lock.
        self._held_lock = threading.Lock()

    def set_stats_provider(self, provider: StatsProvider) -> None:
        self._stats = provider

    def owned(self) -> list[int]:
        return sorted(self._held)

    def joined(self) -> bool:
        """Registered and the membership read once: the share is computed and taken (a
        lease a crashed owner still holds is taken when it lapses)."""
        return self._joined

    def owned_until(self, queue: int) -> float:
        lease = self._held.get(queue)
        return -math.inf if lease is None else lease.deadline - self.safety_margin_s

    def lease_valid(self, queue: int) -> bool:
        return self._clock() < self.owned_until(queue)

    async def start(self, member: MemberInfo, listener: BalanceListener) -> None:
        """Join and take this daemon's share.

        A store that cannot be reached (after its own retries) does not fail the start:
        the daemon starts owning nothing, and the balance loop keeps joining and taking
        queues every ``rebalance_interval_s`` until the store answers.
        """
        self._member = member
        self._listener = listener
        self._main_loop = asyncio.get_running_loop()
        if self._keeper_stores is not None and self._keeper is None:
            self._keeper = Keeper()
            self._keeper.start()
            self._live_membership, self._live_leases = await self._keeper.run(
                _build(self._keeper_stores))
        # Renewing from the start: the first re-balance starts queues whose messages may
        # already block the loop (a stalled handler) before the last of them is taken.
        self._tasks = [self._spawn_live(self._renew_loop(), "balancer-renew")]
        try:
            await self._live(self._live_membership.join(member))
            await self._rebalance()
        except BrokerConnectionError as exc:
            log.warning("membership store unreachable at start (%s); joining in the "
                        "background every %.1fs", exc, self.rebalance_interval_s)
        self._tasks += [
            asyncio.create_task(self._balance_loop(), name="balancer-balance"),
            asyncio.create_task(self._heartbeat_loop(), name="balancer-heartbeat"),
        ]

    async def _live(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a membership write where the heartbeats run (the keeper, if any)."""
        if self._keeper is None:
            await coro
        else:
            await self._keeper.run(coro)

    def _spawn_live(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Future[None]:
        """A liveness loop on the keeper (cancelled through the returned future), or a
        task of this loop without one."""
        if self._keeper is None:
            return asyncio.create_task(coro, name=name)
        return asyncio.wrap_future(self._keeper.submit(coro))

    def _on_main(self, coro: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None] | None:
        """``coro`` to await here when on the daemon's loop; else it is sent there (not
        waited for: the daemon's loop may be the one that is blocked) and None returned."""
        loop = self._main_loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or here is loop:
            return coro
        asyncio.run_coroutine_threadsafe(coro, loop)
        return None

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a task that swallowed its cancellation (Python 3.11's
            # asyncio.timeout can turn a cancel that meets an expiry into TimeoutError)
            # must not stop the hand-over; it is logged and left behind.
            done, pending = await asyncio.wait(self._tasks, timeout=TASKS_STOP_S)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error("balancer task %s failed", _name(task),
                              exc_info=task.exception())
            if pending:
                log.error("balancer task(s) %s did not stop within %.0fs of being "
                          "cancelled; handing the queues over anyway",
                          sorted(_name(t) for t in pending), TASKS_STOP_S)
        assert self._member is not None
        # Leave first so the others recompute their shares, then hand every queue over:
        # drained and acknowledged before its lease is released.
        try:
            await self._live(self._live_membership.leave(self._member.id))
        except (BrokerConnectionError, StoreUnfitError) as exc:  # the record lapses
            log.warning("could not leave the membership (%s); the record lapses", exc)
        renewing = self._spawn_live(self._renew_loop(), "balancer-renew-stop")
        try:
            await asyncio.gather(*(self._give_up(q) for q in list(self._held)))
        finally:
            renewing.cancel()
            await asyncio.wait([renewing], timeout=TASKS_STOP_S)
            await self.membership.close()
            await self.leases.close()
            if self._keeper is not None:
                keeper, self._keeper = self._keeper, None
                await keeper.run(_close(self._live_membership, self._live_leases))
                keeper.stop()

    # -- re-balancing ------------------------------------------------------------------
    def _phase(self) -> float:
        assert self._member is not None
        return timer_phase(self._member.id)

    async def _balance_loop(self) -> None:
        # The first wait is cut short by this daemon's phase: its intervals then start
        # at their own point in the second, not in step with every daemon started with it.
        wait_s = self.rebalance_interval_s * self._phase()
        while not self._stopping:
            waits = [
                asyncio.ensure_future(self.membership.wait_changed(wait_s)),
                asyncio.ensure_future(self.leases.wait_released(wait_s)),
            ]
            wait_s = self.rebalance_interval_s
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            try:
                if not await self._settled():
                    await self._rebalance()
            except StoreUnfitError as exc:  # an operator's to fix: said once an episode
                self._unfit.failed(exc, f"; this daemon keeps the queues it holds "
                                   f"({sorted(self._held)}) and tries again every "
                                   f"{self.rebalance_interval_s:.1f}s")
            except BrokerConnectionError as exc:  # the store's retries gave up: one line
                self._unreachable.log(logging.WARNING, "store", "re-balance failed (%s); "
                                      "retrying every %.1fs", exc, self.rebalance_interval_s)
            except asyncio.CancelledError:
                # Ours (stop()), or one a callee let escape (a task it awaited was
                # cancelled): only the first may end the loop — a daemon whose loop ended
                # on the second never took a queue again.
                current = asyncio.current_task()
                if self._stopping or (current is not None and current.cancelling()):
                    raise
                log.error("re-balance failed: a cancellation escaped from what it called; "
                          "retrying in %.1fs", self.rebalance_interval_s, exc_info=True)
            except Exception:
                log.exception("re-balance failed; retrying in %.1fs", self.rebalance_interval_s)
            else:
                self._unfit.ok()

    async def _settled(self) -> bool:
        """Nothing for a re-balance to do: the last one found every queue where its split
        put it, this daemon still holds exactly its share, and since then no member came
        or went and no lease was granted or released (two small reads) — for at most
        30-60 intervals (:data:`FULL_RECHECK_INTERVALS`).

        Skipping then is what keeps the balancer cheap at scale: a re-balance reads every
        lease holder (``owners()``), which a thousand daemons doing it every interval turn
        into millions of key reads a second (``conveyor sim balancer``). A queue this
        daemon lost, failed to start or still waits for leaves it short of its share, and
        any hand-off elsewhere changes the generation, so every daemon re-balances until
        all agree again — as all did every interval before.
        """
        if (self.placement.needs_stats or self._split_marks is None
                or self._target != set(self._held) or self._clock() >= self._full_due):
            return False
        marks = (await self.membership.version(), await self.leases.generation())
        return marks == self._split_marks

    async def _rebalance(self) -> None:
        assert self._member is not None
        me = self._member.id
        # The marks first: a change after them is seen by the next _settled().
        marks = (await self.membership.version(), await self.leases.generation())
        members = await self._members()
        if me not in {m.id for m in members}:  # our record lapsed: register again
            await self._live(self._live_membership.join(self._member))
            members = sorted([*members, self._member], key=lambda m: m.id)
            marks = (None, None)
        self._joined = True
        owners = await self.leases.owners() if self.placement.needs_owners else {}
        split = self.placement.split(members, self.total_queues, owners)
        target = set(split[me])
        agreed = (self.placement.needs_owners and None not in marks
                  and len(owners) == self.total_queues
                  and all(owners.get(q) == m for m, queues in split.items() for q in queues))
        self._target, self._split_marks = target, marks if agreed else None
        # Counters can miss a change: a daemon of an older version moves none, a Redis
        # failover may lose an increment. So a settled daemon still re-balances in full
        # every 30-60 intervals (where in that range: its phase, so not all at once).
        self._full_due = self._clock() + FULL_RECHECK_INTERVALS * (
            1 + self._phase()) * self.rebalance_interval_s
        held = set(self._held)
        await self._move(give=held - target, take=target - held)

    async def _move(self, *, give: set[int], take: set[int]) -> None:
        """Give up the queues of ``give`` and take those of ``take``, all at once.

        A stop does not cut a hand-over short: cancelled halfway through its drain, a
        queue lost the acknowledgements still to be sent, the stop's own give-up found
        no agent left to drain and released the lease, and the next owner ran those
        finished messages again. Shielded, the hand-over goes on and the stop's give-up
        of the queue waits for it on the queue's lock. Takes are cancelled as before (a
        stopping daemon starts nothing)."""
        handing = (asyncio.ensure_future(self._give_up_all(sorted(give)))
                   if give else None)
        await asyncio.gather(
            *([asyncio.shield(handing)] if handing is not None else []),
            *(self._take(q) for q in sorted(take)),
        )

    async def _give_up_all(self, queues: list[int]) -> None:
        try:
            await asyncio.gather(*(self._give_up(q) for q in queues))
        except Exception:
            if not self._stopping:
                raise  # to the re-balance, which logs it
            log.exception("handing over queues %s failed", queues)

    async def _members(self) -> list[MemberInfo]:
        """The live members; without their records when the placement needs no stats."""
        if self.placement.needs_stats:
            return await self.membership.members()
        return [MemberInfo(id=ident, host="", pid=0, started_at=0.0)
                for ident in await self.membership.member_ids()]

    def _lock(self, queue: int) -> asyncio.Lock:
        return self._queue_locks.setdefault(queue, asyncio.Lock())

    async def _take(self, queue: int) -> None:
        assert self._member is not None and self._listener is not None
        async with self._lock(queue):
            if queue in self._held or self._stopping:
                return
            failures, retry_at = self._failed_starts.get(queue, (0, 0.0))
            if self._clock() < retry_at:
                return  # backing off after a failed start
            try:
                lease = await self.leases.acquire(queue, self._member.id, self.lease_ttl_s)
            except StoreUnfitError as exc:  # its lease's keys hold something else
                self._failed_starts[queue] = (failures + 1, self._clock()
                                              + self._start_backoff.delay(failures + 1))
                if queue not in self._unfit_leases:
                    self._unfit_leases.add(queue)
                    log.error("queue %d: not taken: %s; tried again with back-off", queue,
                              exc)
                return
            if queue in self._unfit_leases:
                self._unfit_leases.discard(queue)
                log.warning("queue %d: its lease can be taken again", queue)
            if lease is None:
                return  # still held by its previous owner; retried on the next event
            self._held[queue] = lease
            log.info("acquired queue %d (fencing token %d)", queue, lease.token)
            try:
                await self._listener.queue_acquired(queue, lease)
            except Exception as exc:
                await self._start_failed(queue, lease, failures + 1, exc)
            else:
                self._failed_starts.pop(queue, None)

    async def _start_failed(self, queue: int, lease: Lease, failures: int,
                            exc: Exception) -> None:
        """Undo a take whose start raised, so that a later re-balance retries it.

        Kept, the lease would be renewed forever by a daemon that pulls nothing from
        the queue, and no re-balance would retry it (it counts as held).
        """
        assert self._listener is not None
        backoff_s = self._start_backoff.delay(failures)
        self._failed_starts[queue] = (failures, self._clock() + backoff_s)
        log.warning("queue %d: start failed (%s); releasing it, retrying in %.1fs "
                    "(failure %d)", queue, error_text(exc), backoff_s, failures)
        with self._held_lock:
            lease = self._held.pop(queue, lease)
        try:
            await self._listener.queue_lost(queue)  # whatever the start left behind
        except Exception:
            log.exception("queue %d: cleaning up after a failed start", queue)
        await self._release(lease, "not started")

    async def _give_up(self, queue: int) -> None:
        assert self._listener is not None
        async with self._lock(queue):
            lease = self._held.get(queue)
            if lease is None:
                return
            await self._listener.queue_released(queue)
            with self._held_lock:
                lease = self._held.pop(queue, lease)  # renewed while it drained
            await self._release(lease, "given up")

    async def _release(self, lease: Lease, what: str) -> None:
        """Release ``lease`` of a queue no longer held, and log what happened: released;
        no longer ours (nothing to release); or the store failed, so the lease lapses
        within its TTL and only then may another daemon take the queue. Never raises:
        the queue is given up either way."""
        queue = lease.queue
        try:
            released = await self.leases.release(lease)
        except Exception as exc:
            log.warning("queue %d: %s, but releasing its lease failed (%s); it lapses "
                        "within %.1fs ([balancer] lease_ttl_s), then another daemon may "
                        "take the queue", queue, what, error_text(exc), self.lease_ttl_s)
            return
        if released:
            log.info("released queue %d", queue)
        else:
            log.warning("queue %d: %s; its lease (token %d) was no longer this daemon's "
                        "(it lapsed or another daemon took it): nothing to release",
                        queue, what, lease.token)

    # -- renewing ----------------------------------------------------------------------
    async def _renew_loop(self) -> None:
        """Renew each lease once a third of its TTL has passed; report lost ones.

        Ticks every ttl/10, so a lease whose renewals fail is reported lost between
        ``ttl - margin`` and ``ttl - margin + ttl/10`` after its last renewal: before the
        store can expire it and hand it to someone else. Runs on the keeper when there is
        one; then it renews only while the daemon's loop is not stalled past the lease's
        tolerance (see the module's docstring).
        """
        tick_s = self.lease_ttl_s / 10
        renew_when_left_s = self.lease_ttl_s * 2 / 3
        delay_s = tick_s * self._phase()  # the first tick early: out of step with others
        leases = self._live_leases
        while True:
            await asyncio.sleep(delay_s)
            delay_s = tick_s
            renewing = self._loop_answers()
            if not renewing and not self._stall_left:
                await self._leave_stalled()
            for queue, lease in list(self._held.items()):
                if renewing and lease.deadline - self._clock() <= renew_when_left_s:
                    try:
                        # A timeout, not wait_for: wait_for can swallow the
                        # cancellation that stops this loop (Python 3.11), which then
                        # never ends and stop() waits on it for ever. Tolerant of a
                        # stall: a renewal whose answer came meanwhile did not fail.
                        async with StallTolerantTimeout(tick_s * 2):
                            renewed = await leases.renew(lease, self.lease_ttl_s)
                    except Exception as exc:  # store unreachable: keep the old deadline
                        log.warning("queue %d: lease renewal failed: %s", queue,
                                    error_text(exc))
                        renewed = lease
                    with self._held_lock:
                        if self._held.get(queue) is not lease:
                            continue  # released or lost meanwhile
                        if renewed is not None:
                            self._held[queue] = renewed
                    if renewed is None:
                        await self._lost(queue)
                        continue
                if not self.lease_valid(queue) and queue in self._held:
                    await self._lost(queue)

    def _loop_answers(self) -> bool:
        """False while the daemon's loop is stalled past the leases' tolerance."""
        stall_s = self._watchdog.stall_s() if self._watchdog is not None else 0.0
        if stall_s < self._stall_limit_s:
            self._stall_reported = self._stall_left = False
            return True
        if not self._stall_reported and self._held:
            self._stall_reported = True
            log.warning("the event loop has been blocked for %.1fs (past the lease's "
                        "%.1fs tolerance): no longer renewing the leases of queues %s; "
                        "they go to another daemon as the leases lapse, unless the loop "
                        "answers first", stall_s, self._stall_limit_s,
                        sorted(self._held))
        return False

    async def _heartbeat_loop(self) -> None:
        """Refresh this daemon's membership record (and its stats) every ttl/3."""
        delay_s = self.lease_ttl_s / 3 * self._phase()  # the first beat early, likewise
        while True:
            await asyncio.sleep(delay_s)
            delay_s = self.lease_ttl_s / 3
            assert self._member is not None
            if self._stats is not None:
                self._member = msgspec.structs.replace(self._member, stats=self._stats())
            try:
                await self._live(self._live_membership.heartbeat(self._member))
            except Exception as exc:
                log.warning("membership heartbeat failed: %s", exc)

    async def _leave_stalled(self) -> None:
        """Leave the membership while stalled past the tolerance, so that the others'
        split no longer counts this daemon and they take its queues once the leases lapse
        (its next re-balance, once its loop answers again, joins again)."""
        self._stall_left = True
        if self._member is None:
            return
        try:
            await self._live_membership.leave(self._member.id)
        except Exception as exc:
            log.warning("could not leave the membership while stalled: %s", exc)
        culprit = self._watchdog.culprit if self._watchdog is not None else None
        if culprit is not None and culprit.queue in self._held:
            what = (f"handler {culprit.handler} blocked the event loop of daemon "
                    f"{self._member.id} past the lease's {self._stall_limit_s:.1f}s")
            try:
                await self._live_leases.note_stall(culprit.queue, culprit.message_id, what)
            except Exception as exc:  # the count still catches it; only the cause is lost
                log.warning("could not record the stall of message %s: %s",
                            culprit.message_id, exc)

    async def _lost(self, queue: int) -> None:
        """Drop a lost lease and stop its queue (on the daemon's loop: from the keeper,
        sent there without waiting)."""
        assert self._listener is not None
        with self._held_lock:
            lease = self._held.pop(queue, None)
        if lease is None:
            return
        log.warning("lost the lease of queue %d (token %d); stopping it", queue, lease.token)
        here = self._on_main(self._listener.queue_lost(queue))
        if here is not None:
            await here


def _name(task: asyncio.Future[None]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else "balancer-renew"


async def _build(
    factory: Callable[[], tuple[Membership, LeaseStore]],
) -> tuple[Membership, LeaseStore]:
    """Build the keeper's stores on the keeper's loop (their pools bind to it)."""
    return factory()


async def _close(membership: Membership, leases: LeaseStore) -> None:
    await membership.close()
    await leases.close()


_LOCAL: dict[str, tuple[MemoryMembership, MemoryLeaseStore]] = {}


def local_coordination(name: str) -> tuple[MemoryMembership, MemoryLeaseStore]:
    """The in-process membership and lease store shared by every daemon of ``name``."""
    found = _LOCAL.get(name)
    if found is None:
        found = _LOCAL[name] = (MemoryMembership(), MemoryLeaseStore())
    return found
