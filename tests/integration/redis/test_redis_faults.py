"""Worker processes on a real Redis, killed, paused, scaled and cut off from the server.

Every test starts real ``conveyor worker`` subprocesses running tests/apps/recorder.py,
which writes one line per handled message (flushed per line, so SIGKILL loses nothing
already written). Counting those lines tells what was lost and what was duplicated.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pytest
import redis

from conveyor.adapters.redis.keys import Keys
from conveyor.client import Publish, SyncClient
from conveyor.platform.config import Config, load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import (
    RedisServer,
    Worker,
    read_records,
    wait_file_lines,
    write_config,
)
from tests.servers import RedisClusterServers

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TOTAL_QUEUES = 8
LEASE_TTL_S = Config().balancer.lease_ttl_s  # the workers here run with the default
CACHE = 128
FAST_TTL_S = 2.0
"""The lease of the tests whose point does not depend on its length (fencing after a
pause, an outage past the lease): they wait out a lease or two, and 2 s instead of the
default 5 s makes each of them seconds shorter. The failover test keeps the default: its
time is a figure in docs/redis.md."""
FAST_LEASES: dict[str, object] = {"lease_ttl_s": FAST_TTL_S, "rebalance_interval_s": 0.2}
FAST_MEMBERS: dict[str, object] = {"member_ttl_s": 1.0, "heartbeat_interval_s": 0.2}


Server = RedisServer | RedisClusterServers
"""A standalone redis-server, or a local Redis Cluster (``mode = "cluster"``)."""


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.redis_cluster)])
def target(request: pytest.FixtureRequest) -> Server:
    """The tests that run on both: a redis-server, or a cluster of their own."""
    fixture = "redis_server" if request.param == "standalone" else "fresh_redis_cluster"
    server: Server = request.getfixturevalue(fixture)
    return server


def keys_of(server: Server) -> Keys:
    return Keys("t", cluster=isinstance(server, RedisClusterServers))


def mget(server: Server, keys: list[str]) -> list[bytes | None]:
    client = server.client()
    try:
        if isinstance(client, redis.RedisCluster):
            return list(client.mget_nonatomic(keys))
        return list(client.mget(keys))
    finally:
        client.close()


def owners(server: Server) -> dict[int, str]:
    values = mget(server, [keys_of(server).lease("rec", q) for q in range(TOTAL_QUEUES)])
    return {q: v.decode().partition(" ")[2] for q, v in enumerate(values) if v is not None}


def outstanding(server: Server, queues: Iterable[int] = range(TOTAL_QUEUES)) -> int:
    """Entries of app ``rec`` not yet acknowledged on ``queues`` (undelivered + pending).

    Read from ``XINFO GROUPS``: no test here deletes entries or rewinds, so Redis always
    knows the group's lag.
    """
    client = server.client()
    total = 0
    try:
        for q in queues:
            for group in client.xinfo_groups(f"t:q:{q}"):
                if group["name"] == b"rec":
                    assert group["lag"] is not None, f"queue {q}: redis lost track of the lag"
                    total += int(group["lag"]) + int(group["pending"])
    finally:
        client.close()
    return total


def member_of(worker: Worker, view: dict[int, str]) -> set[int]:
    """Queues whose lease holder is this worker's daemon (member ids embed the pid)."""
    return {q for q, m in view.items() if f"-{worker.proc.pid}-" in m}


def publish(cfg: Path, n: int, streams: int) -> None:
    with SyncClient.from_config(load_config(cfg, environ={})) as client:
        for start in range(0, n, 2000):
            client.publish_batch(
                Publish("items", f"s{i % streams}", {"seq": i})
                for i in range(start, min(start + 2000, n))
            )


def start(workers: list[Worker], tmp: Path, cfg: Path, n: int, **kw: object) -> list[Worker]:
    new = [Worker(f"w{len(workers) + i}", cfg, tmp, **kw) for i in range(n)]  # type: ignore[arg-type]
    workers.extend(new)
    return new


def wait_split(server: Server, ws: list[Worker], timeout_s: float = 30) -> None:
    """Until every queue is leased and each worker holds its best-fit share."""
    def balanced() -> bool:
        view = owners(server)
        shares = [len(member_of(w, view)) for w in ws]
        return len(view) == TOTAL_QUEUES and min(shares) >= TOTAL_QUEUES // len(ws)
    wait_until_sync(balanced, timeout_s, f"{len(ws)} workers to share the queues")


def run_under_way(
    server: Server, workers: list[Worker], tmp: Path, *, daemons: int, work_ms: float,
    n: int, streams: int, handled: int, slots: int, cache: int | None = None,
    fast_leases: bool = False, env: dict[str, str] | None = None,
) -> tuple[Path, list[Worker]]:
    """Start ``daemons`` workers, wait for their split, publish, and wait for ``handled``
    (with ``fast_leases``: :data:`FAST_LEASES` and :data:`FAST_MEMBERS`; ``env`` goes to
    each worker's environment)."""
    worker: dict[str, object] = {} if cache is None else {"cache_capacity": cache}
    leases: dict[str, dict[str, object]] = (
        {"balancer": FAST_LEASES, "redis": FAST_MEMBERS} if fast_leases else {})
    cfg = config_for(server, tmp / "c.toml", worker=worker, slots={"count": slots}, **leases)
    ws = start(workers, tmp, cfg, daemons, work_ms=work_ms, env=env)
    wait_split(server, ws)
    publish(cfg, n, streams)
    wait_file_lines([w.record for w in ws], handled, 60, "the run to be under way")
    return cfg, ws


def config_for(server: Server, path: Path, **sections: dict[str, object]) -> Path:
    if isinstance(server, RedisClusterServers):
        sections = {**sections, "redis": {**sections.get("redis", {}), "mode": "cluster"}}
    return write_config(path, server.url, **sections)


def check_order(rows: list[tuple[float, int, int, str, int, str]]) -> None:
    """Per stream, each process saw increasing seqs, redelivered messages aside."""
    counts = Counter(r[5] for r in rows)
    seen: dict[tuple[int, str], int] = {}
    for _, pid, _, key, seq, mid in rows:
        if counts[mid] > 1:
            continue
        last = seen.get((pid, key), -1)
        assert seq > last, f"stream {key}: pid {pid} saw seq {seq} after {last}"
        seen[(pid, key)] = seq


def test_a_killed_daemons_queues_are_taken_over_without_loss(
    target: Server, workers: list[Worker], tmp_path: Path
) -> None:
    redis_server = target
    n, streams = 50_000, 500
    _, ws = run_under_way(redis_server, workers, tmp_path, daemons=3, work_ms=2, n=n,
                          streams=streams, handled=12_000, slots=32, cache=CACHE)
    records = [w.record for w in ws]

    victim = ws[0]
    victim_queues = member_of(victim, owners(redis_server))
    killed_at = time.monotonic()
    victim.proc.kill()
    wait_until_sync(
        lambda: victim_queues.isdisjoint(member_of(victim, owners(redis_server)))
        and victim_queues <= set(owners(redis_server)),
        LEASE_TTL_S + 10, "the killed daemon's queues to be taken over",
    )
    failover_s = time.monotonic() - killed_at
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 120,
                    "every message to be handled")
    survivors = ws[1:]
    assert [w.stop() for w in survivors] == [0, 0]

    rows = read_records(records)
    ids = Counter(r[5] for r in rows)
    duplicates = sum(c - 1 for c in ids.values())
    print(f"\nSIGKILL: failover {failover_s:.2f}s, duplicates {duplicates} "
          f"(victim owned queues {sorted(victim_queues)})")
    assert len(ids) == n
    # Only what the victim held unacknowledged can come back: at most a cache per queue.
    assert duplicates <= len(victim_queues) * CACHE
    check_order(rows)
    assert failover_s <= LEASE_TTL_S + 2.0
    survivors_pids = {w.proc.pid for w in survivors}
    assert any(r[1] in survivors_pids and r[2] in victim_queues for r in rows)


def test_graceful_scale_out_and_in_lose_and_duplicate_nothing(
    target: Server, workers: list[Worker], tmp_path: Path
) -> None:
    redis_server = target
    # Both hand-offs must move live work. Left to its pace (16 slots / 5 ms = 3,200
    # msgs/s a worker) the backlog could drain while the joiner starts on a loaded
    # machine, so once the run is under way each message takes another 50 ms (the
    # recorder's slow file: 640 msgs/s for two workers) until both hand-offs are seen.
    n, streams = 30_000, 300
    slow = tmp_path / "slow"
    env = {"CONVEYOR_TEST_SLOW_WHILE": str(slow)}
    cfg, first = run_under_way(redis_server, workers, tmp_path, daemons=2, work_ms=5, n=n,
                               streams=streams, handled=3_000, slots=16, env=env)
    slow.touch()
    assert outstanding(redis_server) > 0, "nothing left to hand over when the joiner starts"
    [joiner] = start(workers, tmp_path, cfg, 1, work_ms=5, env=env)  # scale out
    wait_split(redis_server, [*first, joiner])
    joined = member_of(joiner, owners(redis_server))
    leaver = first[0]
    leaving = member_of(leaver, owners(redis_server))
    assert outstanding(redis_server, joined) > 0, "the joiner's queues were already drained"
    assert outstanding(redis_server, leaving) > 0, "nothing left to hand over at the stop"
    assert leaver.stop() == 0  # scale in, gracefully
    assert "abandoned=0" in leaver.stderr
    slow.unlink()
    records = [w.record for w in workers]
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 90,
                    "every message to be handled")
    assert [w.stop() for w in workers[1:]] == [0, 0]
    rows = read_records(records)
    handled = Counter((r[3], r[4]) for r in rows)
    assert set(handled) == {(f"s{i % streams}", i) for i in range(n)}, "lost or foreign"
    assert sum(handled.values()) == n, "a graceful hand-off duplicated messages"
    assert len({r[5] for r in rows}) == n
    # Both hand-offs moved live work: the joiner handled messages, and so did the
    # survivors on the queues the leaver gave up.
    assert any(r[1] == joiner.proc.pid for r in rows)
    stayed = {w.proc.pid for w in workers[1:]}
    assert any(r[1] in stayed and r[2] in leaving for r in rows)
    check_order(rows)


_ACK = re.compile(r"DEBUG conveyor.redis: queue (\d+): acked \d+ message\(s\) "
                  r"under token (\d+) at server time ([\d.]+)")
_ACQ = re.compile(r"acquired queue (\d+) \(fencing token (\d+)\)")
_ACQ_AT = re.compile(r"^(\S+ \S+) INFO conveyor.balancer: acquired queue (\d+) "
                     r"\(fencing token (\d+)\)", re.M)


def _log_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_paused_daemon_never_acks_after_losing_its_lease(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # 2,000 messages, not 6,000, and caches of 64: the victim's queues come back to it
    # after the pause with every cached message handed back, re-read as redelivered
    # messages (one at a time per daemon, their starts counted first): the test's time
    # grew with what the caches held while what it shows did not.
    n = 2_000
    # The default re-balance interval: a resumed daemon notices the lost lease (logged
    # below) before a re-balance could release the queue.
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 16},
                       worker={"cache_capacity": 64}, balancer={"lease_ttl_s": FAST_TTL_S},
                       redis=FAST_MEMBERS)
    [victim] = start(workers, tmp_path, cfg, 1, work_ms=20, log_level="debug")
    [other] = start(workers, tmp_path, cfg, 1, work_ms=2)
    wait_split(redis_server, [victim, other])
    publish(cfg, n, 200)
    records = [victim.record, other.record]
    wait_file_lines([victim.record], 200, 60, "the paused daemon to be busy")

    view = owners(redis_server)
    lost = member_of(victim, view)
    old_tokens = {(int(q), int(t)) for q, t in _ACQ.findall(victim.stderr)}
    paused_at = time.time()
    victim.signal(signal.SIGSTOP)
    wait_until_sync(lambda: lost <= member_of(other, owners(redis_server)),
                    FAST_TTL_S + 10, "the paused daemon's queues to be taken over")
    victim.signal(signal.SIGCONT)
    wait_until_sync(
        lambda: all(f"lost the lease of queue {q} " in victim.stderr for q in lost), 15,
        "the resumed daemon to notice it lost its leases",
    )
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 90,
                    "every message to be handled")
    assert [victim.stop(), other.stop()] == [0, 0]

    acks = _ACK.findall(victim.stderr)
    assert acks, "the ack log lines this test inspects are missing"
    # When the other daemon took each lost queue (its log line comes after the lease
    # was granted; same host, same clock as the server).
    taken_at: dict[int, float] = {}
    for when, q, token in _ACQ_AT.findall(other.stderr):
        if int(q) in lost and int(token) > min(t for qq, t in old_tokens if qq == int(q)):
            taken_at.setdefault(int(q), _log_time(when))
    assert set(taken_at) == lost
    # An ack the server *ran* under an old token after the queue was taken over would
    # be a fencing failure (the client may log an earlier, legitimate ack late: it
    # was stopped between the reply and the log line, so log times prove nothing).
    late_acks = [
        (q, t, at) for q, t, at in acks
        if (int(q), int(t)) in old_tokens and int(q) in taken_at
        and float(at) >= taken_at[int(q)]
    ]
    assert late_acks == [], "a fenced daemon acknowledged under a lost lease"
    assert any(_log_time(w) >= paused_at for w, *_ in _ACQ_AT.findall(other.stderr))
    assert len({r[5] for r in read_records(records)}) == n


def test_daemons_ride_out_a_redis_restart_without_loss(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    n = 10_000
    _, ws = run_under_way(redis_server, workers, tmp_path, daemons=2, work_ms=1, n=n,
                          streams=300, handled=2_000, slots=32)
    records = [w.record for w in ws]
    redis_server.stop()
    wait_until_sync(lambda: all("unreachable" in w.stderr for w in ws), 15,
                    "the daemons to notice the outage")
    redis_server.start()  # same port, same directory: the AOF brings everything back
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 90,
                    "every message to be handled after the restart")
    assert [w.stop() for w in ws] == [0, 0]
    assert all("reachable again" in w.stderr for w in ws), [outage_lines(w) for w in ws]
    assert len({r[5] for r in read_records(records)}) == n
    client = redis_server.client()
    try:
        assert sum(client.xpending(f"t:q:{q}", "rec")["pending"]
                   for q in range(TOTAL_QUEUES)) == 0
    except redis.ResponseError:
        pytest.fail("consumer groups did not survive the restart")
    finally:
        client.close()


def outage_lines(worker: Worker) -> list[str]:
    """What ``worker`` logged of the broker's outage and of its queues meanwhile (what a
    failed check of its log should show)."""
    return [line[:200] for line in worker.stderr.splitlines()
            if any(word in line for word in ("reachable", "still waiting", "lease", "released",
                                             "acquired", "Error", "error"))]


def test_an_outage_longer_than_the_lease_ttl_loses_nothing(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    """Redis down past every lease: the daemons drop their queues, then lease them anew."""
    # At most 16 slots / 5 ms = 3,200 msgs/s per worker: work is left at the outage.
    # Every cache is full then and comes back as redelivered messages, which run one at
    # a time per daemon (their starts counted first): a cache of 32, not 128, keeps that
    # tail a quarter as long (it was most of the test's time) and the bound as tight.
    n, streams, cache = 20_000, 300, 32
    _, ws = run_under_way(redis_server, workers, tmp_path, daemons=2, work_ms=5, n=n,
                          streams=streams, handled=2_000, slots=16, cache=cache,
                          fast_leases=True)
    records = [w.record for w in ws]
    held = {w.name: member_of(w, owners(redis_server)) for w in ws}
    tokens_before = {w.name: _tokens(w.stderr) for w in ws}
    assert outstanding(redis_server) > 0, "the run was over before the outage"
    redis_server.stop()
    down_at = time.monotonic()
    # The outage outlasts the TTL: each daemon gives up all its leases, and the
    # server, back from its AOF, holds none of them any more.
    wait_until_sync(
        lambda: all(f"lost the lease of queue {q} " in w.stderr
                    for w in ws for q in held[w.name])
        and time.monotonic() - down_at > FAST_TTL_S + 0.5,
        FAST_TTL_S + 15, "the daemons to give up their leases",
    )
    redis_server.start()
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 90,
                    "every message to be handled after the restart")
    wait_split(redis_server, ws)
    assert [w.stop() for w in ws] == [0, 0]
    assert all("reachable again" in w.stderr for w in ws)
    # Every queue was leased again, under a newer token than before the outage.
    for w in ws:
        after = _tokens(w.stderr)
        for q, token in tokens_before[w.name].items():
            if q in after and after[q] > token:
                continue
            other = next(o for o in ws if o is not w)
            assert _tokens(other.stderr).get(q, 0) > token, f"queue {q} never re-leased"
    rows = read_records(records)
    handled = Counter((r[3], r[4]) for r in rows)
    assert set(handled) == {(f"s{i % streams}", i) for i in range(n)}
    duplicates = sum(handled.values()) - n
    print(f"\noutage > lease TTL: duplicates {duplicates}")
    # Only what was pulled and not yet acknowledged when the leases were lost returns.
    assert duplicates <= TOTAL_QUEUES * cache


def _tokens(stderr: str) -> dict[int, int]:
    """The newest fencing token a daemon logged acquiring, per queue."""
    out: dict[int, int] = {}
    for q, t in _ACQ.findall(stderr):
        out[int(q)] = max(out.get(int(q), 0), int(t))
    return out


def pending(server: RedisServer, queues: Iterable[int]) -> int:
    """Entries of app ``rec`` delivered to some consumer and not acknowledged."""
    client = server.client()
    try:
        return sum(int(g["pending"]) for q in queues for g in client.xinfo_groups(f"t:q:{q}")
                   if g["name"] == b"rec")
    finally:
        client.close()


def test_a_paused_daemon_starts_no_handler_for_the_queues_it_lost(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    """SIGSTOP past the lease, SIGCONT: what the paused daemon had pulled and not started
    goes to the new owner; the paused one starts none of it (its own records say so)."""
    n, streams, slots = 2_000, 200, 4
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": slots},
                       worker={"cache_capacity": 64}, balancer=FAST_LEASES,
                       redis=FAST_MEMBERS)
    # Slow handlers and few slots: the victim's caches are full of unstarted messages.
    [victim] = start(workers, tmp_path, cfg, 1, work_ms=200, record_starts=True,
                     log_level="debug")
    [other] = start(workers, tmp_path, cfg, 1, work_ms=1)
    wait_split(redis_server, [victim, other])
    publish(cfg, n, streams)
    wait_file_lines([victim.starts], 3 * slots, 30, "the victim to be busy")

    lost = member_of(victim, owners(redis_server))
    victim.signal(signal.SIGSTOP)
    paused_at = time.time()
    held_at_pause = pending(redis_server, lost)
    assert held_at_pause > slots, "the victim held no unstarted message: nothing to test"
    wait_until_sync(lambda: lost <= member_of(other, owners(redis_server)),
                    FAST_TTL_S + 10, "the paused daemon's queues to move")
    resumed_at = time.time()
    victim.signal(signal.SIGCONT)
    # It gives each queue up, noticing the lost lease or re-balancing it away first
    # (then its release finds the lease another's: nothing to release).
    wait_until_sync(
        lambda: all(f"lost the lease of queue {q} " in victim.stderr
                    or f"queue {q}: given up; its lease " in victim.stderr for q in lost),
        15, "the resumed daemon to drop the queues it lost",
    )
    assert victim.stop() == 0
    records = [victim.record, other.record]
    wait_until_sync(lambda: len({r[5] for r in read_records(records)}) >= n, 60,
                    "every message to be handled")
    assert other.stop() == 0

    # A queue the victim leased again after the pause (a later re-balance) is its own
    # again from the moment the grant was logged.
    regained: dict[int, float] = {}
    for when, q, _ in _ACQ_AT.findall(victim.stderr):
        if int(q) in lost and _log_time(when) >= resumed_at:
            regained.setdefault(int(q), _log_time(when))
    starts = read_records([victim.starts])
    late = [r for r in starts if r[2] in lost and resumed_at <= r[0] < regained.get(r[2], 1e12)]
    print(f"\nSIGSTOP: victim held {held_at_pause} unacknowledged on queues {sorted(lost)}; "
          f"started after resuming on lost queues: {len(late)}")
    assert late == [], "a paused daemon started handlers on queues it had lost"

    rows = read_records(records)
    handled = Counter((r[3], r[4]) for r in rows)
    assert set(handled) == {(f"s{i % streams}", i) for i in range(n)}, "lost or foreign"
    # Duplicates: only the calls the victim had started before the pause, whose acks
    # were then refused (at most its slots, plus finished calls whose ack was not sent).
    ids = Counter(r[5] for r in rows)
    started_before = {r[5] for r in starts if r[0] < paused_at}
    doubled = {mid for mid, count in ids.items() if count > 1}
    assert doubled <= started_before, "a message the victim never started ran twice"
    assert len(doubled) <= held_at_pause
    check_order(rows)


def fences(server: Server) -> dict[int, int]:
    """Lease grants so far, per queue (the fencing-token counter grows by one a grant)."""
    values = mget(server, [keys_of(server).fence("rec", q) for q in range(TOTAL_QUEUES)])
    return {q: int(v or 0) for q, v in enumerate(values)}


def grants_since(server: Server, before: dict[int, int]) -> dict[int, int]:
    return {q: g - before[q] for q, g in fences(server).items() if g != before[q]}


_REL_AT = re.compile(r"^(\S+ \S+) INFO conveyor.balancer: released queue (\d+)$", re.M)


def unowned_gaps(ws: list[Worker], after: float) -> list[float]:
    """Per release logged since ``after``: how long until the next grant of that queue
    (the first under a newer fencing token than the released lease's; 0 when the taker
    logged its grant before the giver logged its release, which it may: the giver logs
    once the release has returned). Waits until each such grant is logged: the lease
    changes hands in Redis (what the test waited for) a moment before its new owner
    writes the line."""

    def gaps_now() -> list[float] | None:
        grants = [(w, int(q), _log_time(t), int(token))
                  for w in ws for t, q, token in _ACQ_AT.findall(w.stderr)]
        gaps = []
        for w in ws:
            for t, q in _REL_AT.findall(w.stderr):
                at = _log_time(t)
                if at >= after:
                    released = max(token for who, qq, g, token in grants
                                   if who is w and qq == int(q) and g <= at)
                    later = [g for _, qq, g, token in grants
                             if qq == int(q) and token > released]
                    if not later:
                        return None
                    gaps.append(max(min(later) - at, 0.0))
        return gaps

    wait_until_sync(lambda: gaps_now() is not None, 30, "each released queue's next grant")
    gaps = gaps_now()
    assert gaps is not None
    return gaps


def test_scaling_three_to_four_to_three_moves_only_the_surplus(
    target: Server, workers: list[Worker], tmp_path: Path
) -> None:
    """3 -> 4 daemons over 8 queues: the two holding three give one each; 4 -> 3: the
    leaver's two go to two of the others. Four hand-offs, none lost or doubled."""
    # Work must be under way at each move: once it is, the recorder's slow file makes
    # each message take another 50 ms (16 slots: 320 msgs/s a worker, not 3,200) until
    # both moves are seen, so the backlog cannot drain while the joiner starts.
    n, streams = 40_000, 400
    redis_server = target
    cfg = config_for(redis_server, tmp_path / "c.toml", slots={"count": 16},
                       balancer={"rebalance_interval_s": 0.2})
    slow = tmp_path / "slow"
    env = {"CONVEYOR_TEST_SLOW_WHILE": str(slow)}
    first = start(workers, tmp_path, cfg, 3, work_ms=5, env=env)
    wait_split(redis_server, first)
    publish(cfg, n, streams)
    records = [w.record for w in first]
    wait_file_lines(records, 2_000, 60, "the run to be under way")
    slow.touch()

    held = {w.name: member_of(w, owners(redis_server)) for w in first}
    before, scaled_at = fences(redis_server), time.time() - 0.01
    [joiner] = start(workers, tmp_path, cfg, 1, work_ms=5, env=env)  # scale out
    wait_split(redis_server, [*first, joiner])
    joined = grants_since(redis_server, before)
    took = member_of(joiner, owners(redis_server))
    assert outstanding(redis_server, took) > 0, "the joiner's queues were drained already"
    gave = {w.name for w in first if held[w.name] & took}
    assert joined == {q: 1 for q in took} and len(took) == 2, f"grants on joining: {joined}"
    assert gave == {w.name for w in first if len(held[w.name]) == 3}, "moved from a share"

    before = fences(redis_server)
    assert joiner.stop() == 0  # scale in, gracefully
    assert "abandoned=0" in joiner.stderr and " moved=0" in joiner.stderr
    wait_split(redis_server, first)
    slow.unlink()
    left = grants_since(redis_server, before)
    assert left == {q: 1 for q in took}, f"grants on leaving: {left}"

    gaps = unowned_gaps([*first, joiner], scaled_at)
    assert len(gaps) == 4
    all_records = [w.record for w in workers]
    wait_until_sync(lambda: len({r[5] for r in read_records(all_records)}) >= n, 90,
                    "every message to be handled")
    assert [w.stop() for w in first] == [0, 0, 0]
    print(f"\nscale 3->4->3: {len(joined)} + {len(left)} hand-offs; queue unowned "
          f"{min(gaps):.2f}-{max(gaps):.2f}s per hand-off")
    rows = read_records(all_records)
    handled = Counter((r[3], r[4]) for r in rows)
    assert set(handled) == {(f"s{i % streams}", i) for i in range(n)}, "lost or foreign"
    assert sum(handled.values()) == n, "a graceful hand-off duplicated messages"
    assert any(r[1] == joiner.proc.pid for r in rows)
    check_order(rows)
