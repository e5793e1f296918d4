"""Consumer groups on Kafka (the adapter's ``groups`` facet): the groups reading the
topic, removing one.

Kafka groups are cluster-wide; a group is *on the topic* when it has a committed offset
on one of its partitions, or members whose subscription names it. Such a group is listed
on every queue asked for: where it committed nothing, its lag counts from the start of
the partition, where its consumers would begin. Kafka keeps records by time or size,
whatever the groups have read, so no group ever holds retention back.

Brokers differ (tansu, the test broker): describing several groups in one request
fails to decode there, so groups are described one at a time, and a group that cannot
be described is shown without a member count; its members' subscriptions come back
empty, so a group that has members but no commit yet is not seen on tansu.

Deleting uses the DeleteGroups request (Kafka 1.1+), which aiokafka's admin client
does not offer (declared in :mod:`conveyor.adapters.kafka.aiokafka_internals`).
:func:`leave_group` sends the LeaveGroup aiokafka skips on brokers that number
generations from 0 (tansu).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka import errors as kerrors
from aiokafka.admin import AIOKafkaAdminClient

from conveyor.adapters.kafka import offsets as kafka_offsets
from conveyor.adapters.kafka.aiokafka_internals import (
    delete_groups_request,
    leave_group_request,
    send_request,
    subscription,
)
from conveyor.adapters.kafka.cluster import KafkaCluster
from conveyor.adapters.kafka.connection import kafka_errors
from conveyor.adapters.kafka.handoff import HandoffLog
from conveyor.platform.adapter import ConsumerGroups
from conveyor.platform.errors import BrokerError, ConfigError
from conveyor.platform.operations.groups import GroupInfo

log = logging.getLogger("conveyor.kafka")

LEAVE_TIMEOUT_S = 2.0
"""Longest a stopping daemon waits to leave its group (the session timeout is the fallback)."""

_GROUP_ID_NOT_FOUND = 69
_NON_EMPTY_GROUP = 68


class KafkaGroups(ConsumerGroups):
    """The groups reading one topic (see the module docstring)."""

    retention_follows_groups = False  # Kafka keeps records by time or size

    def __init__(self, cluster: KafkaCluster, handoffs: HandoffLog) -> None:
        self._cluster = cluster
        self._handoffs = handoffs

    async def on(self, queues: Sequence[int]) -> list[GroupInfo]:
        """Every group on the topic, on each of ``queues``, with its lag and member count.

        A topic whose partitions are not ``$.queues.total`` is refused
        (:meth:`KafkaCluster.check_partitions`), as a daemon's start refuses it: with more,
        a group that read only the partitions past the total would go unlisted; with
        fewer, the ends of partitions that do not exist cannot be read (aiokafka waits
        40 s for them)."""
        cluster = self._cluster
        tps = [TopicPartition(cluster.topic, q) for q in queues]
        with kafka_errors("listing consumer groups"):
            async with cluster.admin() as admin:
                if cluster.topic not in await admin.list_topics():
                    return []
                await cluster.check_partitions(admin)
                found: dict[str, tuple[dict[int, Any], int | None]] = {}
                for name in sorted({str(g[0]) for g in await admin.list_consumer_groups()}):
                    committed = await _committed(admin, name, tps)
                    members, reads_topic = await _members(cluster, name)
                    if committed or reads_topic:
                        found[name] = (committed, members)
            if not found:
                return []
            async with cluster.reading(cluster.topic, queues) as consumer:
                begin = await consumer.beginning_offsets(tps)
                ends = await cluster.high_watermarks(consumer, {tp: int(begin[tp]) for tp in tps})
                high = {tp.partition: end for tp, end in ends.items()}
        out = []
        for tp in tps:
            q = tp.partition
            for name, (committed, members) in found.items():
                entry = committed.get(q)
                if entry is None:
                    lag = high[q] - int(begin[tp])
                else:
                    lag = kafka_offsets.unfinished(high[q], int(begin[tp]), int(entry.offset),
                                                   entry.metadata)
                out.append(GroupInfo(name, q, max(0, lag), members=members, appended=high[q]))
        return out

    async def has(self, queues: Sequence[int], group: str) -> bool:
        """Whether ``group`` committed on one of ``queues`` or has members reading the topic."""
        with kafka_errors(f"reading the offsets of group {group!r}"):
            async with self._cluster.admin() as admin:
                tps = [TopicPartition(self._cluster.topic, q) for q in queues]
                if await _committed(admin, group, tps):
                    return True
        return (await _members(self._cluster, group))[1]

    async def delete(self, group: str, queues: Sequence[int], *,
                     dead_letters: bool = False) -> list[int]:
        """DeleteGroups for ``group``; the queues it had committed offsets on.

        Kafka groups span topics: a group with offsets on another topic is refused (they
        would go too). Its hand-off records are overwritten, so that a new group of the same
        name never mistakes one for its own.
        """
        if dead_letters:
            raise ConfigError(
                f"--with-dead-letters: kafka keeps every app's dead letters in one topic "
                f"({self._cluster.dlq_topic}), which cannot be deleted per app; delete the group "
                f"without it, and purge the app's letters with `conveyor dlq purge --all --yes "
                f"--app {group}`"
            )
        tps = [TopicPartition(self._cluster.topic, q) for q in queues]
        with kafka_errors(f"deleting group {group!r}"):
            async with self._cluster.admin() as admin:
                had = sorted(await _committed(admin, group, tps))
                others = await _other_topics(self._cluster, self._handoffs, group)
                if others:
                    raise BrokerError(
                        f"kafka group {group!r} also holds offsets on topic(s) {sorted(others)}, "
                        "which deleting it would remove too; delete it with Kafka's own tools "
                        "(kafka-consumer-groups --delete-offsets) if that is meant"
                    )
                coordinator = await admin.find_coordinator(group)
                try:
                    response = await send_request(admin, delete_groups_request([group]),
                                                  coordinator)
                except (kerrors.IncompatibleBrokerVersion, NotImplementedError) as exc:
                    raise BrokerError(
                        f"kafka: this broker cannot delete consumer groups (DeleteGroups, Kafka "
                        f"1.1+: {exc}); delete {group!r} with the broker's own tools"
                    ) from None
                for _, code in response.results:
                    if code == _NON_EMPTY_GROUP:
                        raise BrokerError(
                            f"kafka group {group!r} has live members: stop its workers")
                    if code not in (0, _GROUP_ID_NOT_FOUND):
                        raise BrokerError(f"kafka: deleting group {group!r} failed: "
                                          f"{kerrors.for_code(code).__name__}")
                if had and self._handoffs.topic in await admin.list_topics():
                    for queue in had:
                        await self._handoffs.write(group, queue, -1, "")
        return had


async def _committed(admin: AIOKafkaAdminClient, group: str,
                     tps: list[TopicPartition]) -> dict[int, Any]:
    """The group's committed offsets on ``tps`` (the partitions are named: tansu cannot
    answer a request for all of them)."""
    offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
    return {tp.partition: o for tp, o in offsets.items() if o.offset >= 0}


async def _members(cluster: KafkaCluster, group: str) -> tuple[int | None, bool]:
    """(members, whether one subscribes to the topic); (None, False) if undescribable.

    A client of its own: a reply that fails to decode closes the connection.
    """
    try:
        async with cluster.admin() as admin:
            [response] = await admin.describe_consumer_groups([group])
        [described] = response.to_object()["groups"]
    except (kerrors.KafkaError, OSError, ValueError) as exc:
        log.debug("cannot describe group %r: %s", group, exc)
        return None, False
    members = described["members"]
    reads = False
    for member in members:
        with contextlib.suppress(Exception):  # empty or foreign metadata: unknown
            reads = reads or cluster.topic in subscription(member["member_metadata"])
    return len(members), reads


async def _other_topics(cluster: KafkaCluster, handoffs: HandoffLog, group: str) -> set[str]:
    """Topics other than ours (and its hand-off topic) the group holds offsets on.

    The partitions are named in the request: tansu cannot answer one for all of them.
    """
    async with cluster.admin() as admin:
        ours = {cluster.topic, handoffs.topic}
        topics = [t for t in await admin.list_topics() if t not in ours]
        if not topics:
            return set()
        tps = [TopicPartition(d["topic"], p["partition"])
               for d in await admin.describe_topics(topics) for p in d["partitions"]]
        offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
    return {tp.topic for tp, o in offsets.items() if o.offset >= 0}


async def leave_group(cluster: KafkaCluster, group: str, member_id: str) -> None:
    """Tell the coordinator that ``member_id`` left ``group`` (LeaveGroup), so the group
    re-balances at once instead of after the member's session timeout.

    For a consumer that has already stopped: aiokafka sends LeaveGroup itself only when
    the generation is above 0, and tansu hands out generation 0 first, so a member of a
    group's first generation would otherwise be waited out. Best effort, like aiokafka's
    own: an error is logged, and the session timeout remains the fallback.
    """
    fallback = "the coordinator drops this member after its session timeout"
    try:
        async with asyncio.timeout(LEAVE_TIMEOUT_S):
            with kafka_errors(f"leaving group {group!r}"):
                async with cluster.admin() as admin:
                    coordinator = await admin.find_coordinator(group)
                    response = await send_request(
                        admin, leave_group_request(group, member_id), coordinator)
        if response.error_code:
            log.warning("group %s: LeaveGroup refused (%s); %s", group,
                        kerrors.for_code(response.error_code).__name__, fallback)
        else:
            log.info("group %s: left the group (LeaveGroup)", group)
    except TimeoutError:
        log.warning("group %s: LeaveGroup had no answer in %.0fs; %s", group,
                    LEAVE_TIMEOUT_S, fallback)
    except BrokerError as exc:
        log.warning("group %s: %s; %s", group, exc, fallback)
