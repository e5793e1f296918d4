"""A Sentinel-managed primary replaced by its replica, under real workers and clients.

Each test runs on servers of its own (a primary, one replica, three sentinels:
tests/servers/sentinel.py), with ``[redis] mode = "sentinel"`` and ``min_replicas = 1``:

* the primary is SIGKILLed while a publisher keeps publishing: the sentinels promote the
  replica, every batch whose publish returned is handled, and the workers, which never
  restart, find the new primary by themselves. The promoted replica has no replica until
  the killed node comes back (the sentinels make it a replica), and publishes raise
  ``PublishNotReplicated`` meanwhile (written, not confirmed);
* a switchover (``SENTINEL FAILOVER``) leaves the old primary up and writable until the
  sentinels demote it, seconds later, which throws away what it took meanwhile: no
  publish written there may return as confirmed, and the client then moves on by itself.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from conveyor import Publish, PublishUncertain, SyncClient
from conveyor.adapters.redis.keys import Keys
from conveyor.platform.config import load_config
from conveyor.platform.errors import BrokerError
from conveyor.platform.mapper import HashRingQueueMapper
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import Worker, read_records, write_config
from tests.servers import SENTINEL_SERVICE, RedisSentinelServers

pytestmark = [pytest.mark.redis, pytest.mark.redis_sentinel, pytest.mark.slow]

TOTAL = 8
KEYS = Keys("t")
CACHE_PER_QUEUE = 128
"""``[worker] cache_capacity``: most entries a worker holds per queue, pulled and not yet
acknowledged (what a failover may deliver again)."""


def sentinel_config(path: Path, servers: RedisSentinelServers) -> Path:
    return write_config(path, "redis:///0", redis={
        "mode": "sentinel", "sentinels": servers.addresses,
        "sentinel_service": SENTINEL_SERVICE, "min_replicas": 1, "replica_timeout_ms": 500,
    }, slots={"count": 16}, worker={"cache_capacity": CACHE_PER_QUEUE})


class Publisher:
    """Publishes batches of 50 over 100 streams from a thread, as fast as they go, and
    sorts them by what the publish said."""

    def __init__(self, cfg: Path) -> None:
        self.cfg = cfg
        self.confirmed: list[int] = []
        self.uncertain: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        seq = 0
        with SyncClient.from_config(load_config(self.cfg, environ={})) as client:
            while not self._stop.is_set():
                batch = list(range(seq, seq + 50))
                seq += 50
                try:
                    client.publish_batch(Publish("items", f"s{i % 100}", {"seq": i})
                                         for i in batch)
                    self.confirmed.extend(batch)
                except (PublishUncertain, BrokerError):  # PublishNotReplicated among them
                    self.uncertain.extend(batch)

    def wait_confirmed(self, more: int, what: str) -> int:
        """Wait for ``more`` confirmed messages from now; return the count before them."""
        start = len(self.confirmed)
        wait_until_sync(lambda: len(self.confirmed) >= start + more, 30, what)
        return start

    def wait_refused(self, what: str) -> None:
        told = len(self.uncertain)
        wait_until_sync(lambda: len(self.uncertain) > told, 15, what)


def leased(servers: RedisSentinelServers) -> int:
    with servers.node(servers.primary()[1]).admin() as admin:
        return sum(v is not None for v in admin.mget([KEYS.lease("rec", q)
                                                      for q in range(TOTAL)]))


def unhandled(servers: RedisSentinelServers, wanted: set[int], records: list[Path],
              ws: list[Worker]) -> str:
    """What a failure to handle every confirmed message needs explained: which messages,
    on which queues, what the new primary holds for them, and what the workers said."""
    missing = sorted(wanted - {r[4] for r in read_records(records)})
    mapper = HashRingQueueMapper(TOTAL)
    queues = Counter(mapper.queue_for_key("items", f"s{seq % 100}") for seq in missing)
    lines = [f"{len(missing)} confirmed, never handled (first {missing[:5]}), by queue "
             f"{dict(queues)}"]
    with servers.node(servers.primary()[1]).admin() as admin:
        for queue in sorted(queues):
            stream = KEYS.queue(queue)
            if not admin.exists(stream):
                lines.append(f"queue {queue}: no stream on the primary")
                continue
            on_primary = {json.loads(f["body"])["seq"] for _, f in admin.xrange(stream)}
            lines.append(f"queue {queue}: {len(set(missing) & on_primary)} of them in the "
                         f"stream; groups {admin.xinfo_groups(stream)}; lease "
                         f"{admin.get(KEYS.lease('rec', queue))!r}")
    lines += [f"-- {w.name} (alive {w.alive()}):\n{w.stderr[-3000:]}" for w in ws]
    return "\n".join(lines)


def test_a_primary_killed_mid_run_loses_no_confirmed_message_and_workers_ride_it_out(
    fresh_redis_sentinel: RedisSentinelServers, workers: list[Worker], tmp_path: Path
) -> None:
    servers = fresh_redis_sentinel
    cfg = sentinel_config(tmp_path / "s.toml", servers)
    ws = [Worker(f"w{i}", cfg, tmp_path, work_ms=1) for i in range(2)]
    workers.extend(ws)
    wait_until_sync(lambda: leased(servers) == TOTAL, 30, "every queue to be leased")

    with Publisher(cfg) as publisher:
        publisher.wait_confirmed(3000, "publishing to be under way")
        before = len(publisher.confirmed)
        victim = servers.primary()[1]
        servers.kill(victim)
        failover_s = servers.wait_failover(victim)
        # Alone, the promoted replica cannot get a publish confirmed by a replica, and
        # says so, until the killed node is back as its replica.
        publisher.wait_refused("publishes to be refused for want of a replica")
        servers.restart(victim)
        servers.wait_replica_rejoined(victim)
        resumed_at = publisher.wait_confirmed(3000, "publishing to go on after the failover")
    confirmed, uncertain = publisher.confirmed, publisher.uncertain

    records = [w.record for w in ws]
    wanted = set(confirmed)
    try:
        wait_until_sync(lambda: wanted <= {r[4] for r in read_records(records)}, 60,
                        "every confirmed message to be handled")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{unhandled(servers, wanted, records, ws)}") from None
    assert all(w.alive() for w in ws), "a worker died in the failover"
    assert [w.stop() for w in ws] == [0, 0]
    rows = read_records(records)
    handled = Counter(r[4] for r in rows)
    duplicates = sum(c - 1 for c in handled.values())
    print(f"\nsentinel failover {failover_s:.2f}s; confirmed {len(confirmed)} "
          f"({before} before the kill), uncertain {len(uncertain)}, duplicates {duplicates}")
    assert wanted <= set(handled), "a confirmed message was lost in the failover"
    # Uncertain batches may or may not have been written; nothing else may appear.
    assert set(handled) <= wanted | set(uncertain)
    # Redelivered: what the workers held when the primary died, their acknowledgements
    # unsent or not yet on the replica (acks wait for min_replicas too, so the rest are
    # there). Every queue lived on the dead primary: at most a cache per queue, the most
    # when a split vote among the sentinels makes the outage outlast the leases and
    # every queue changes hands.
    assert duplicates <= TOTAL * CACHE_PER_QUEUE
    # The workers resumed by themselves: messages confirmed after the failover were
    # handled by the same processes.
    assert {r[1] for r in rows if r[4] >= confirmed[resumed_at - 1]} <= {w.proc.pid for w in ws}
    assert failover_s < 15


def test_a_switchover_confirms_no_publish_the_demoted_primary_took(
    fresh_redis_sentinel: RedisSentinelServers, tmp_path: Path
) -> None:
    servers = fresh_redis_sentinel
    cfg = sentinel_config(tmp_path / "s.toml", servers)
    old = servers.primary()
    with Publisher(cfg) as publisher:
        publisher.wait_confirmed(2000, "publishing to be under way")
        with servers.sentinels[0].admin() as admin:
            admin.execute_command("SENTINEL", "FAILOVER", SENTINEL_SERVICE)
        wait_until_sync(lambda: servers.primary() != old, 15, "the sentinels to switch over")
        # The old primary, still up, takes publishes until it is demoted; none can be
        # confirmed, as its replica left it to become the primary.
        servers.wait_replica_rejoined(old[1])
        resumed_at = publisher.wait_confirmed(2000, "publishing to go on on the new primary")
    confirmed = publisher.confirmed

    with servers.node(servers.primary()[1]).admin() as admin:
        seqs = {json.loads(fields["body"])["seq"]
                for q in range(TOTAL) for _, fields in admin.xrange(KEYS.queue(q))}
    print(f"\nswitchover: confirmed {len(confirmed)} ({resumed_at} before it settled), "
          f"uncertain {len(publisher.uncertain)}, "
          f"lost unconfirmed {len(set(publisher.uncertain) - seqs)}")
    assert set(confirmed) <= seqs, "a confirmed publish was lost in the switchover"
