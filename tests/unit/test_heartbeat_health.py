"""What a daemon publishes with its heartbeat beyond the counts, for the console's daemons
page: its version (a field of the record, read back from records that predate it), loop
stalls, ready and draining, the rate limit in force, and handler latency percentiles over
the calls since the last heartbeat (from the duration histogram the chain counts anyway).
"""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.metrics import MeterProvider

import conveyor
from conveyor.adapters.kafka.members import Described, MemberReport, join
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.histograms import HistogramFamily, RecentPercentiles, percentile
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon.metrics import LATENCY_QUANTILES
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Record,
    config,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)

OLD_RECORD = b'{"id":"shop-a-1","host":"a","pid":7,"started_at":1.0,"stats":{"handled":3.0}}'


def test_a_record_written_before_the_version_field_still_decodes() -> None:
    old = msgspec.json.decode(OLD_RECORD, type=MemberInfo)
    assert (old.id, old.version, old.stats) == ("shop-a-1", "", {"handled": 3.0})
    mine = MemberInfo.for_this_process("shop-")
    assert mine.version == conveyor.__version__
    assert msgspec.json.decode(msgspec.json.encode(mine), type=MemberInfo) == mine


def test_a_kafka_report_carries_the_version_and_an_older_one_still_decodes() -> None:
    old = msgspec.json.decode(
        b'{"id":"d1","host":"a","pid":7,"started_at":1.0,"queues":[0],"stats":{},"at":5.0}',
        type=MemberReport)
    new = MemberReport("d2", "b", 8, 1.0, [1], {}, 5.0, "1.2.3")
    [first, second] = join([Described("d1-x", "d1", "", None), Described("d2-y", "d2", "", None)],
                           {"d1": old, "d2": new}, 5.0, 10)
    assert (first.info.version, second.info.version) == ("", "1.2.3")


BOUNDS = (0.001, 0.01, 0.1, 1.0)


def test_a_percentile_is_interpolated_inside_its_bucket() -> None:
    # 100 values: 50 in (0, 1 ms], 40 in (1, 10 ms], 10 in (10, 100 ms]
    counts = [50, 40, 10, 0, 0]
    assert percentile(BOUNDS, counts, 0.5) == pytest.approx(0.001)
    assert percentile(BOUNDS, counts, 0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert percentile(BOUNDS, counts, 0.95) == pytest.approx(0.01 + 0.09 * 5 / 10)
    assert percentile(BOUNDS, [0, 0, 0, 0, 4], 0.99) == 1.0  # above every bound: the last
    assert percentile(BOUNDS, [0] * 5, 0.5) is None


def test_recent_percentiles_cover_the_calls_since_the_last_sample_only() -> None:
    family = HistogramFamily("d", "s", "", BOUNDS)
    series = family.series({"handler": "a"})
    recent = RecentPercentiles(family, (0.5,), min_window_s=0.5)
    for _ in range(10):
        series.record(0.5)  # slow calls first
    assert recent.sample(now=1.0) == {0.5: pytest.approx(0.55)}
    for _ in range(10):
        family.series({"handler": "b"}).record(0.0005)  # then fast ones, another handler
    assert recent.sample(now=1.1) == {0.5: pytest.approx(0.55)}  # too soon: repeated
    assert recent.sample(now=2.0) == {0.5: pytest.approx(0.0005)}  # the slow ones are past
    assert recent.sample(now=3.0) == {}  # no call since: nothing to say


async def test_a_daemon_publishes_its_health_with_its_heartbeat() -> None:
    record = Record()
    adapter = fresh_adapter()
    # static: no balancer heartbeat takes the latency window before the test reads it
    cfg = config(slots={"rate": {"per_second": 500.0, "store": "local"}},
                 balancer={"kind": "static"})
    d = daemon(recording_app(record, delay_s=0.002), adapter, cfg,
               telemetry=Telemetry(meter_provider=MeterProvider()))
    assert d.stats_snapshot()["ready"] == 0  # not started
    await publish_items(d.client, 40, streams=4)
    await d.start()
    try:
        await wait_until(lambda: record.handled == 40, 10, what="40 handled")
        # Snapshots repeat the last latency for 0.5 s, then take the window since.
        await wait_until(lambda: "latency.p50_s" in d.stats_snapshot(), 5, interval_s=0.05,
                         what="a latency window over the calls")
        stats = d.stats_snapshot()
        assert stats["ready"] == 1 and "draining" not in stats
        assert stats["loop.stalls"] == 0
        assert (stats["rate.limit_per_s"], stats["rate.waiting"]) == (500.0, 0)
        p50, p95, p99 = (stats[key] for key in LATENCY_QUANTILES.values())
        assert 0.001 <= p50 <= p95 <= p99 <= 0.1  # 2 ms calls, in the (1, 2.5 ms] bucket
        d.draining = True  # as stop() sets it first
        assert d.stats_snapshot()["draining"] == 1 and d.stats_snapshot()["ready"] == 0
    finally:
        await d.stop()


def test_a_daemon_without_a_meter_or_a_rate_limit_publishes_neither() -> None:
    d = daemon(recording_app(Record()), fresh_adapter())
    stats = d.stats_snapshot()
    assert not [key for key in stats if key.startswith(("latency.", "rate."))]
    assert stats["loop.stalls"] == 0
