"""Moving an app's position on Kafka partitions: to a sequence token or a point in time.

A token names its offset; a time is resolved per partition to the first record at or
after it (``offsets_for_times``, or a scan of record timestamps where the broker cannot
answer, as on tansu). The new position is committed for the app's group, with a
hand-off record that forgets the done offsets recorded above the old watermark.

The checks (a token of another queue, a queue still owned, a forward move) are the
port's :meth:`~conveyor.platform.adapter.QueueAdapter.rewind_queues`; this module
supplies the facts: :func:`check_time`, :func:`forward_gap` and :func:`owners`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka import members as kafka_members
from conveyor.adapters.kafka.aiokafka_internals import fetch_committed
from conveyor.adapters.kafka.cluster import KafkaCluster, TopicMissingError
from conveyor.adapters.kafka.connection import kafka_errors
from conveyor.adapters.kafka.handoff import HandoffLog
from conveyor.adapters.kafka.members import assigned_partitions
from conveyor.platform.errors import BrokerError, TokenRangeError
from conveyor.platform.ids import SequenceToken

log = logging.getLogger("conveyor.kafka")

_LIVE_STATES = frozenset({"Stable", "PreparingRebalance", "CompletingRebalance"})


async def rewind(cluster: KafkaCluster, handoffs: HandoffLog, queue: int, group: str,
                 to: SequenceToken | float) -> None:
    """Commit the offset ``to`` names on ``queue`` as ``group``'s position (unchecked).
    A missing topic is created (``$.kafka.create_topic``): only a group's creation
    (``create_group``) rewinds where none exists, to set an app's start before it runs."""
    with kafka_errors(f"rewinding app {group!r} on queue {queue}"):
        await cluster.ensure_topic()
        async with cluster.probing(group) as consumer:
            offset = await _target(cluster, consumer, queue, to)
        await _commit_position(cluster, handoffs, group, queue, offset)
    log.info("moved %s on queue %d to offset %d", group, queue, offset)


def check_time(when: float) -> None:
    """Refuse a time in the future (by this machine's clock), with ``allow_forward`` or
    without: Kafka keeps no position past a partition's end, so the time would resolve
    to the end as it is now, and the messages published until the time came would be
    delivered, not skipped as the time says (Redis sets the group at the time itself,
    and skips them)."""
    if when > time.time():
        raise TokenRangeError(
            "a time in the future: Kafka keeps no position past a partition's end, so the "
            "messages published until then would be delivered, not skipped; to skip what "
            "the queues hold now, give the current time (with --allow-forward)")


async def forward_gap(cluster: KafkaCluster, queue: int, group: str,
                      to: SequenceToken | float) -> int:
    """Messages between the group's committed position and ``to``, when ``to`` is ahead
    (none where the topic does not exist: there is nothing to skip).

    A token past the partition's end is refused (:class:`TokenRangeError`), with or
    without ``allow_forward``: Kafka keeps no position there. A receiver given one takes
    the partition for a re-created topic and stops reading it (seen on tansu:
    :meth:`~conveyor.adapters.kafka.cluster.KafkaCluster.topic_gone`), and once the
    partition grows past it the messages published in between are skipped. A time
    resolves to the end at most."""
    with kafka_errors(f"reading app {group!r}'s position"):
        try:
            offset, position, end = await _target_position_and_end(cluster, queue, group, to)
        except TopicMissingError:
            return 0
    if offset > end:
        raise TokenRangeError(
            f"queue {queue}: offset {offset} is past the end of the partition (its next "
            f"offset is {end}): Kafka keeps no position there, and the messages published "
            f"until it is reached would be skipped; give a token up to "
            f"{SequenceToken(queue, end)}"
        )
    return max(0, offset - position)


async def owners(cluster: KafkaCluster, queues: Sequence[int], group: str) -> dict[int, str]:
    """The members of consumer group ``group`` that hold one of ``queues``.

    That sees daemons under the ``kafka-group`` balancer, on any machine: by the
    assignment the coordinator reports (Apache Kafka does), and by the queues each live
    member reports it owns (:mod:`conveyor.adapters.kafka.members`; tansu reports no
    assignments). It cannot see receivers with a manual assignment — daemons under the
    ``dynamic`` balancer (their leases live in the membership store: ``conveyor rewind``
    reads those) or the ``static`` one.
    """
    with kafka_errors(f"reading the members of group {group!r}"):
        try:
            described = await _describe_group(cluster, group)
        except (kerrors.UnsupportedVersionError, kerrors.IncompatibleBrokerVersion) as exc:
            log.info("kafka: cannot describe group %s (%s); its members are not checked",
                     group, exc)
            return {}
    wanted = set(queues)
    held: dict[int, str] = {}
    for found in described:
        if found.get("group") != group or found.get("state") not in _LIVE_STATES:
            continue
        for member in found.get("members", []):
            holds = assigned_partitions(member.get("member_assignment"), cluster.topic)
            for queue in sorted(holds & wanted):
                held.setdefault(queue, member.get("client_id") or member.get("member_id", "?"))
    for live in await kafka_members.group_members(cluster, group):
        for queue in sorted(set(live.queues) & wanted):
            held.setdefault(queue, live.info.id)
    return held


async def _describe_group(cluster: KafkaCluster, group: str) -> list[dict[str, Any]]:
    async with cluster.admin() as admin:
        responses = await admin.describe_consumer_groups([group])
    return [g for r in responses for g in r.to_object().get("groups", [])]


async def _target_position_and_end(cluster: KafkaCluster, queue: int, group: str,
                                   to: SequenceToken | float) -> tuple[int, int, int]:
    """The offset ``to`` names on ``queue``, the group's committed position there, and
    the partition's end (its high watermark) where ``to`` is a token (else the offset
    itself: a time resolves to the end at most)."""
    async with cluster.probing(group) as consumer:
        offset = await _target(cluster, consumer, queue, to)
        tp = TopicPartition(cluster.topic, queue)
        committed = await fetch_committed(consumer, tp)
        log_start = int((await consumer.beginning_offsets([tp]))[tp])
        position = int(committed[0]) if committed is not None else log_start
        end = offset
        if isinstance(to, SequenceToken):
            end = await cluster.high_watermark(consumer, tp, max(position, log_start))
    return offset, position, end


async def _target(cluster: KafkaCluster, consumer: AIOKafkaConsumer, queue: int,
                  to: SequenceToken | float) -> int:
    """The offset a token names, or the first at or after a time."""
    if isinstance(to, SequenceToken):
        return to.major
    return await offset_for_time(cluster, consumer, TopicPartition(cluster.topic, queue),
                                 int(to * 1000))


async def _commit_position(cluster: KafkaCluster, handoffs: HandoffLog, group: str,
                           queue: int, offset: int) -> None:
    tp = TopicPartition(cluster.topic, queue)
    await handoffs.write(group, queue, offset, "")  # forget recorded done offsets
    try:
        async with cluster.probing(group) as consumer:
            await consumer.commit({tp: OffsetAndMetadata(offset, "")})
    except kerrors.CommitFailedError:
        # A broker that refuses commits from outside the group's generation
        # (tansu, once a group had members): commit as its only member.
        await _commit_as_member(cluster, group, {tp: OffsetAndMetadata(offset, "")})


async def _commit_as_member(
    cluster: KafkaCluster, group: str, offsets: dict[TopicPartition, OffsetAndMetadata]
) -> None:
    consumer = cluster.new_consumer(group, session_timeout_ms=cluster.config.session_timeout_ms)
    await consumer.start()
    try:
        consumer.subscribe([cluster.topic])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cluster.config.session_timeout_ms / 1000 + 10
        while not set(offsets) <= consumer.assignment():
            if loop.time() > deadline:
                raise BrokerError(
                    f"kafka: could not join group {group!r} alone to rewind it; "
                    "stop its workers first"
                )
            await asyncio.sleep(0.1)
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def offset_for_time(cluster: KafkaCluster, consumer: AIOKafkaConsumer,
                          tp: TopicPartition, when_ms: int) -> int:
    """The first offset whose timestamp is >= ``when_ms`` (the end if none is).

    The broker's answer is taken once the record it names is read and found stamped at
    or after the time: tansu answers -1 for the timestamp, or, now and then, offset 0
    with the asked time as its timestamp, whatever offset 0 holds — a rewind to the
    current time then went back to the start (1 partition in 5 here). Otherwise the
    partition is scanned from the start up to the fetch high watermark."""
    found = (await consumer.offsets_for_times({tp: when_ms})).get(tp)
    if found is not None and found.timestamp >= 0:
        consumer.seek(tp, found.offset)
        named = (await consumer.getmany(tp, timeout_ms=500, max_records=1)).get(tp, [])
        if named and named[0].offset == found.offset and named[0].timestamp >= when_ms:
            return int(found.offset)
    begin = (await consumer.beginning_offsets([tp]))[tp]
    high = await cluster.high_watermark(consumer, tp, begin)
    consumer.seek(tp, begin)
    position = begin
    while position < high:
        batch = (await consumer.getmany(tp, timeout_ms=500, max_records=500)).get(tp, [])
        for record in batch:
            if record.timestamp >= when_ms:
                return int(record.offset)
            position = record.offset + 1
    return high
