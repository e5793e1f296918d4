"""Hand-offs on Kafka: done offsets above the watermark are skipped."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.group_balancer import KafkaGroupBalancer
from conveyor.client import Client, Publish
from conveyor.platform.errors import BrokerError
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config, nothing_left_unacknowledged

pytestmark = pytest.mark.kafka


async def test_a_drain_that_times_out_replays_only_the_unfinished_message(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, worker={"drain_timeout_s": 0.3})
    items = [Publish("orders", "slow", {"k": "slow", "seq": 0})]
    items += [Publish("orders", f"f{i}", {"k": f"f{i}", "seq": 0}) for i in range(60)]
    async with Client.from_config(config) as client:
        await client.publish_batch(items)

    first = Recorder()
    first.hold["slow"] = asyncio.Event()  # never set: the first owner cannot finish it
    daemon = WorkerDaemon(first.app, config)
    await daemon.start()
    await wait_until(lambda: len(first.seen) == 60, 20, what="the fast messages handled")
    report = await daemon.stop()
    assert report.handled == 60 and report.abandoned >= 1

    second = Recorder()
    daemon = WorkerDaemon(second.app, config)
    await daemon.start()
    try:
        await wait_until(lambda: len(second.seen) >= 1, 20, what="the unfinished message")
        adapter = daemon.adapter
        await wait_until(lambda: _lag_is(adapter, 0), 10, what="lag 0")
    finally:
        await daemon.stop()
    assert second.seen == [("slow", 0)], "done messages above the watermark were replayed"


async def test_a_drain_line_counts_the_done_messages_above_the_watermark_as_acknowledged(
    tansu: Tansu, topic: str
) -> None:
    """The drain line adds up: pulled = acked + released + abandoned + lost. Messages
    done behind an unfinished one are recorded above the committed watermark, and the
    next owner skips them (the test above), so they are acknowledged; they were counted
    nowhere, and a fault walk's Kafka worker stopped by SIGTERM under load said
    ``pulled=3583 acked=2976 handled=3130 ... released=453 moved=0``."""
    config = kafka_config(tansu.bootstrap, topic, worker={"drain_timeout_s": 0.3})
    items = [Publish("orders", "slow", {"k": "slow", "seq": seq}) for seq in range(2)]
    items += [Publish("orders", f"f{i}", {"k": f"f{i}", "seq": 0}) for i in range(20)]
    async with Client.from_config(config) as client:
        await client.publish_batch(items)

    first = Recorder()
    first.hold["slow"] = asyncio.Event()  # never set: slow 0 abandoned, slow 1 unstarted
    daemon = WorkerDaemon(first.app, config)
    await daemon.start()
    await wait_until(lambda: len(first.seen) == 20, 20, what="the fast messages handled")
    report = await daemon.stop()
    assert (report.pulled, report.handled) == (22, 20), report
    assert (report.abandoned, report.released, report.moved) == (1, 1, 0), report
    assert report.acked == 20, f"the 20 done above the watermark are acknowledged: {report}"


async def _lag_is(adapter: object, want: int) -> bool:
    assert isinstance(adapter, KafkaAdapter)
    return await adapter.lag(0, "kafka-test") == want


async def test_a_graceful_group_rebalance_redelivers_nothing(tansu: Tansu, topic: str) -> None:
    """Work in flight across the revocation is finished and committed, not redone.

    A publisher runs throughout, and a message of key ``held`` is kept running until
    the revocation has begun, so daemon a must drain in-flight work before the
    coordinator hands its partitions to b. The two daemons record separately.
    """
    config = kafka_config(
        tansu.bootstrap, topic, queues={"total": 4}, balancer={"kind": "kafka-group"},
    )
    rec_a, rec_b = Recorder(max_delay_s=0.01), Recorder(max_delay_s=0.01)
    gate = rec_a.hold["held"] = asyncio.Event()
    a = WorkerDaemon(rec_a.app, config)
    b = WorkerDaemon(rec_b.app, config)  # same app name, same group: a re-balance
    await a.start()
    assert isinstance(a.balancer, KafkaGroupBalancer)
    assert await a.balancer.wait_assigned(20)

    in_flight_at_revocation: list[int] = []
    release = a.queue_released

    async def released(queue: int) -> None:
        agent = a.agents.get(queue)
        if agent is not None:
            in_flight_at_revocation.append(sum(not e.done for e in agent.cache.entries))
        asyncio.get_running_loop().call_later(0.2, gate.set)  # the drain must wait for it
        await release(queue)

    a.queue_released = released  # type: ignore[method-assign]

    published: list[tuple[str, int]] = []
    seqs: dict[str, int] = {}
    stop_publishing = asyncio.Event()

    async def publish_throughout(client: Client) -> None:
        while not stop_publishing.is_set():
            batch = []
            for i in range(20):
                key = "held" if not published and i == 0 else f"k{len(published) % 40}"
                seq = seqs[key] = seqs.get(key, -1) + 1
                batch.append(Publish("orders", key, {"k": key, "seq": seq}))
                published.append((key, seq))
            await client.publish_batch(batch)
            await asyncio.sleep(0.05)

    try:
        async with Client.from_config(config) as client:
            publisher = asyncio.create_task(publish_throughout(client))
            try:
                await wait_until(lambda: rec_a.running >= 1 and len(rec_a.seen) > 20, 20,
                                 what="work under way on a, one message held")
                await b.start()
                await wait_until(
                    lambda: bool(b.balancer.owned()) and len(a.balancer.owned()) < 4,
                    30, what="the partitions shared",
                )
                await wait_until(lambda: len(rec_b.seen) > 20, 20, what="b handling")
            finally:
                stop_publishing.set()
                await publisher
        n = len(published)
        await wait_until(lambda: len(rec_a.seen) + len(rec_b.seen) >= n, 60, what="all handled")
        await wait_until(lambda: nothing_left_unacknowledged(a), 15, 0.1,
                         "every message acknowledged: none can come again")
    finally:
        gate.set()  # a failure before the re-balance must not leave a's drain waiting
        await b.stop()
        await a.stop()
    assert any(in_flight_at_revocation), "nothing was in flight when partitions moved"
    assert rec_a.seen and rec_b.seen
    seen = rec_a.seen + rec_b.seen
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} duplicate(s)"
    assert set(seen) == set(published)
    for key in set(rec_a.by_key) | set(rec_b.by_key):
        on_a, on_b = rec_a.by_key.get(key, []), rec_b.by_key.get(key, [])
        assert on_a == sorted(on_a) and on_b == sorted(on_b), key
        assert not on_a or not on_b or on_a[-1] < on_b[0], f"{key} handed over out of order"


async def test_the_handoff_topic_is_compacted_and_read_backwards_from_the_end(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic)
    adapter = KafkaAdapter(config.kafka, 1)
    log = adapter.handoffs
    log.scan_step = 10
    try:
        await log.write("g", 0, 5, "cv1:2")
        for i in range(25):  # another app's records bury ours: the scan must go back
            await log.write("other", 0, i, "")
        assert await log.read("g", 0, 5) == {7}
        assert log.last_scan_records == 26  # three windows, down to the first record

        await log.write("g", 0, 9, "cv1:1,3")
        assert await log.read("g", 0, 9) == {10, 12}
        assert log.last_scan_records <= log.scan_step, "the latest record is in the last window"
        assert await log.read("g", 0, 5) == set(), "a record the owner moved past is stale"
        assert await log.read("nobody", 0, 0) == set()

        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            described = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, log.topic)]
            )
        finally:
            await admin.close()
        settings = {name: value for name, value, *_ in described[0].resources[0][4]}
        assert settings["cleanup.policy"] == "compact"
    finally:
        await adapter.close()


async def test_the_first_writes_of_many_receivers_prepare_the_topic_once(
    tansu: Tansu, topic: str
) -> None:
    # A daemon's receivers write their first records together (each before its first
    # delivery): one admin client prepares the topic for all, not one each.
    adapter = KafkaAdapter(kafka_config(tansu.bootstrap, topic).kafka, 8)
    prepared: list[list[str]] = []
    create = adapter.cluster.create_topics

    async def counted(wanted: dict[str, int], topic_config: dict[str, str] | None = None,
                      ) -> None:
        prepared.append(sorted(wanted))
        await create(wanted, topic_config)

    adapter.cluster.create_topics = counted  # type: ignore[method-assign]
    try:
        await adapter.ensure_topic()
        prepared.clear()
        handoffs = adapter.handoffs
        await asyncio.gather(*(handoffs.write("g", q, 0, "", 1024) for q in range(8)))
        assert prepared == [[handoffs.topic]]
        for q in range(8):
            assert (await handoffs.read_deliveries("g", q, 0)).redelivered_through == 1024
    finally:
        await adapter.close()


async def test_the_first_writes_share_a_failed_preparation_and_the_next_one_tries_again(
    tansu: Tansu, topic: str
) -> None:
    # The broker refuses the first preparation: every write waiting on it fails with
    # its error at once (one attempt, not one after another), and a later write makes
    # a new attempt, which succeeds.
    adapter = KafkaAdapter(kafka_config(tansu.bootstrap, topic).kafka, 8)
    attempts: list[str] = []
    create = adapter.cluster.create_topics

    async def refused_once(wanted: dict[str, int],
                           topic_config: dict[str, str] | None = None) -> None:
        attempts.append("refused" if not attempts else "created")
        if len(attempts) == 1:
            await asyncio.sleep(0.05)  # the other writers queue up meanwhile
            raise BrokerError("kafka: creating the hand-off topic: refused (test)")
        await create(wanted, topic_config)

    try:
        await adapter.ensure_topic()
        adapter.cluster.create_topics = refused_once  # type: ignore[method-assign]
        handoffs = adapter.handoffs
        outcomes = await asyncio.gather(*(handoffs.write("g", q, 0, "", 1024)
                                          for q in range(8)), return_exceptions=True)
        assert attempts == ["refused"]
        assert all(isinstance(o, BrokerError) and "refused (test)" in str(o)
                   for o in outcomes), outcomes
        await handoffs.write("g", 0, 0, "", 1024)
        assert attempts == ["refused", "created"]
        assert (await handoffs.read_deliveries("g", 0, 0)).redelivered_through == 1024
    finally:
        await adapter.close()
