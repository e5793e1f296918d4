"""Which child pulls which queue, and how a queue moves without being pulled twice.

A queue is moved by releasing it on its owner (drained: in-flight messages finish and
are acknowledged) and only then acquiring it elsewhere, so no queue is ever pulled by
two processes: nothing is duplicated by a scale change, and nothing is lost
(unacknowledged messages of a crashed child are redelivered to the queue's next
owner, as with any receiver).

A child's ``queues`` only ever holds what it confirmed. A queue whose move failed is
owned by nobody, and :func:`adopt_orphans` hands it out at the next inspection.
The split stays even and only the surplus moves: the dynamic balancer's sticky rule
(:func:`plan_moves`, :func:`~conveyor.platform.balancing.balancer.sticky_split`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence

from conveyor.platform.balancing.balancer import sticky_split
from conveyor.workers.supervisor.process import ChildProcess

log = logging.getLogger("conveyor.supervisor")


def plan_moves(
    owners: Mapping[int, int], processes: Sequence[int], total_queues: int
) -> dict[int, tuple[int | None, int]]:
    """The queues to move for an even split over ``processes`` (child numbers), given
    ``owners`` (queue -> child number): queue -> (from, to), from None for a queue owned
    by nobody. The dynamic balancer's sticky rule (:func:`sticky_split`): a process
    keeps what it holds up to its share, so adding or removing one moves only the
    surplus — the new process's share, or the removed one's queues."""
    split = sticky_split([str(n) for n in processes], total_queues,
                         {q: str(n) for q, n in owners.items()})
    return {
        q: (owners.get(q), int(member))
        for member, queues in split.items()
        for q in queues
        if owners.get(q) != int(member)
    }


async def assign(children: Sequence[ChildProcess], queues: Sequence[int]) -> None:
    """Give ``queues`` (owned by nobody) to the living children with the fewest queues."""
    alive = [c for c in children if c.alive]
    if not alive:
        return
    counts = {id(c): len(c.queues) for c in alive}
    plan = []
    for queue in queues:
        target = min(alive, key=lambda c: counts[id(c)])
        counts[id(target)] += 1
        plan.append(target.acquire(queue))
    await _all(plan)


async def adopt_orphans(children: Sequence[ChildProcess], total_queues: int) -> None:
    """Assign the queues no child confirmed owning (a failed move, a dead child)."""
    owned = {q for c in children for q in c.queues}
    orphans = [q for q in range(total_queues) if q not in owned]
    if orphans and any(c.alive for c in children):
        log.warning("supervisor: queue(s) %s owned by nobody; assigning them", orphans)
        await assign(children, orphans)


async def rebalance(
    children: Sequence[ChildProcess], keep: Sequence[ChildProcess], total_queues: int
) -> int:
    """Split the queues evenly over ``keep``, moving as few as possible
    (:func:`plan_moves`): those of a child not kept, and the surplus of those above
    their share. Returns how many moved (or were to: a failed move leaves its queue
    owned by whoever confirmed it, and the next tick adopts an orphan)."""
    by_number = {c.number: c for c in children}
    owners = {q: c.number for c in children for q in c.queues}
    plan = plan_moves(owners, [c.number for c in keep], total_queues)
    await _all(
        by_number[dst].acquire(q) if src is None
        else _move(q, by_number[src], by_number[dst])
        for q, (src, dst) in sorted(plan.items())
    )
    return len(plan)


async def _move(queue: int, src: ChildProcess, dst: ChildProcess) -> None:
    await src.release(queue)  # drained and acknowledged before anyone else pulls it
    await dst.acquire(queue)


async def _all(aws: Iterable[Awaitable[None]]) -> None:
    """Await all of ``aws`` to the end (none left running behind), then raise the first
    error: the caller's next step must see every move finished or failed."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
