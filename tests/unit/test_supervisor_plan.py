"""Which queues the supervisor moves when it adds or removes a process: only the surplus,
and the split stays even however many changes follow (the dynamic balancer's rule)."""

from __future__ import annotations

from conveyor.workers.supervisor.assignment import plan_moves


def started(processes: list[int], total: int) -> dict[int, int]:
    """Owners as the supervisor hands the queues out at start: round the processes."""
    return {q: processes[q % len(processes)] for q in range(total)}


def applied(owners: dict[int, int], moves: dict[int, tuple[int | None, int]]) -> dict[int, int]:
    return {**owners, **{q: dst for q, (_, dst) in moves.items()}}


def shares(owners: dict[int, int]) -> list[int]:
    counts: dict[int, int] = {}
    for process in owners.values():
        counts[process] = counts.get(process, 0) + 1
    return sorted(counts.values())


def test_three_to_four_to_three_processes_moves_only_the_surplus() -> None:
    owners = started([1, 2, 3], 12)
    up = plan_moves(owners, [1, 2, 3, 4], 12)
    assert len(up) == 3 and all(dst == 4 for _, dst in up.values())
    assert {src for src, _ in up.values()} == {1, 2, 3}  # one from each: all keep 3
    owners = applied(owners, up)
    assert shares(owners) == [3, 3, 3, 3]
    down = plan_moves(owners, [1, 2, 3], 12)  # process 4 is removed
    assert len(down) == 3 and all(src == 4 for src, _ in down.values())
    owners = applied(owners, down)
    assert shares(owners) == [4, 4, 4] and set(owners.values()) == {1, 2, 3}


def test_no_change_of_processes_moves_nothing() -> None:
    owners = started([1, 2, 3], 16)
    assert plan_moves(owners, [1, 2, 3], 16) == {}


def test_queues_owned_by_nobody_are_handed_out_to_those_short_of_their_share() -> None:
    owners = {q: p for q, p in started([1, 2], 8).items() if q != 5}  # 5: its acquire failed
    moves = plan_moves(owners, [1, 2], 8)
    assert moves == {5: (None, 2)}


def test_many_changes_keep_the_split_even_and_each_moves_the_fewest() -> None:
    # The round-robin plan this replaced moved as few queues per change, but drifted:
    # after 3 -> 4 -> 3 -> 4 -> 5 -> 6 on 64 queues its shares were 9, 9, 10, 10, 13, 13; and
    # from 10 processes on (numbers compared as text) a new one got 0-2 queues.
    total = 64
    processes = [1, 2, 3]
    owners = started(processes, total)
    serial = 3
    for step in [4, 3, 4, 5, 6, 5, 4, 3, 4, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]:
        if step > len(processes):
            serial += 1
            processes = [*processes, serial]
            moves = plan_moves(owners, processes, total)
            assert all(dst == serial for _, dst in moves.values())
            assert len(moves) == total // len(processes)  # the newcomer's share, no more
        else:
            gone = processes[step % len(processes)]  # not always the newest
            processes = [p for p in processes if p != gone]
            moves = plan_moves(owners, processes, total)
            assert {q for q, (src, _) in moves.items()} == {
                q for q, p in owners.items() if p == gone}  # the removed one's queues only
        owners = applied(owners, moves)
        low, high = min(shares(owners)), max(shares(owners))
        assert high - low <= 1 and set(owners.values()) == set(processes), (step, owners)
