"""A queue balancer driven by Kafka's own consumer-group protocol (``kind = "kafka-group"``).

Each daemon joins the consumer group named after the app (JoinGroup / SyncGroup /
Heartbeat through aiokafka); the group coordinator decides which member reads which
partition and re-balances when members come, go or stop heart-beating. No other
store is needed: a daemon can run with Kafka alone.

The protocol is *eager*: on every re-balance each member is told its partitions are
revoked; this balancer then drains them through the daemon (stop pulling, finish and
commit in-flight messages, under the still valid generation) before it lets the
coordinator continue, so a graceful re-balance redelivers nothing. A member that
dies is dropped after ``session_timeout_ms``; its partitions resume elsewhere from
the committed watermark. A member that stops gracefully drains, then leaves the group
explicitly (LeaveGroup), so the others take its partitions at their next heartbeat
instead of after its session timeout. How long each of these pauses partitions, on
tansu and on Kafka, is in docs/kafka.md ("Failover").

Receivers of the group read and commit through the group's consumer (attached to the
adapter), since Kafka refuses commits from outside a group's live generation.

A partition counts as this daemon's until the coordinator last confirmed the membership
(the assignment, or a heartbeat answered) plus ``session_timeout_ms`` less a fifth: a
daemon paused or cut off past its session starts no handler for it, and when the
partition is then revoked it is stopped at once (lost), not drained.

Each daemon also reports itself — host, pid, owned queues, stats — to the members topic
(:mod:`conveyor.adapters.kafka.members`), since the coordinator tells ``conveyor status``
little or, on some brokers, nothing but member ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from conveyor.adapters.kafka import groups as kafka_groups
from conveyor.adapters.kafka import members as kafka_members
from conveyor.adapters.kafka.adapter import KafkaAdapter
from conveyor.adapters.kafka.aiokafka_internals import (
    membership,
    observe_heartbeats,
    raw_records,
    sticky_assignor,
)
from conveyor.adapters.kafka.app_check import AppCheck, AppIdentity, checking_assignor
from conveyor.adapters.kafka.connection import first_answer, retrying, start_client
from conveyor.adapters.kafka.members import GroupMember, MemberReporter
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.balancing.balancer import BalanceListener, QueueBalancer, StatsProvider
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.config import Config
from conveyor.platform.errors import ConfigError, ConveyorError
from conveyor.platform.tasks import cancel_and_wait
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.kafka_group")


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, balancer: KafkaGroupBalancer) -> None:
        self._balancer = balancer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._balancer._revoked(sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._balancer._assigned(sorted(tp.partition for tp in assigned))


class KafkaGroupBalancer(QueueBalancer):
    def __init__(self, adapter: KafkaAdapter, group: str, total_queues: int) -> None:
        self.adapter = adapter
        self.group = group
        self.total_queues = total_queues
        self._consumer: Any = None
        self._listener: BalanceListener | None = None
        self._owned: set[int] = set()
        self._assigned_once = asyncio.Event()
        self._stopping = False
        self._changing = asyncio.Lock()
        """Held while queues are acquired or released: a stop's release waits for an
        assignment under way, so every queue it acquired is drained (see :meth:`stop`)."""
        self._member: MemberInfo | None = None
        self._joining: asyncio.Task[None] | None = None
        session_s = adapter.config.session_timeout_ms / 1000
        self._confirmed_for_s = session_s - session_s / 5
        self._confirmed_at = -math.inf
        """When (monotonic, taken before the request) the coordinator last confirmed
        this member; +inf when that cannot be observed (revocation alone then fences)."""
        self._reporter = MemberReporter(adapter.cluster, group)
        self._stats: StatsProvider | None = None
        self._reporting: asyncio.Task[None] | None = None
        self._report_now = asyncio.Event()
        self._report_log = ThrottledLog(log, 60.0)
        self._app: tuple[list[str], list[str]] | None = None
        self._total_told: set[int] = set()

    def set_stats_provider(self, provider: StatsProvider) -> None:
        self._stats = provider

    def set_app(self, handlers: Sequence[str], namespaces: Sequence[str]) -> None:
        """Exchange these with the group's members to notice another app under the same
        name (:mod:`conveyor.adapters.kafka.app_check`)."""
        self._app = (list(handlers), list(namespaces))

    async def start(self, member: MemberInfo, listener: BalanceListener) -> None:
        """Join the group; if the broker is down, keep trying in the background.

        A configuration error (a topic with too few partitions) is raised here. While
        the broker is unreachable the daemon owns no queue; the join is retried with
        capped, jittered back-off and is cancelled by :meth:`stop`.
        """
        self._listener = listener
        self._member = member
        cluster = self.adapter.cluster
        cluster.on_topic_changed = listener.balancer_failed  # the worker exits, says why
        joining = asyncio.create_task(
            retrying(cluster.outage, f"joining group {self.group!r}", self._join),
            name="kafka-group-join",
        )
        self._joining = joining
        await first_answer(joining, cluster.outage)
        if joining.done():
            joining.result()  # a configuration error fails the start
        else:
            joining.add_done_callback(self._join_ended)

    def _join_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("group %s: joining failed for good (%s); this daemon owns no queue",
                      self.group, exc)
            if self._listener is not None and not self._stopping:
                self._listener.balancer_failed(exc)

    async def _join(self) -> None:
        cluster = self.adapter.cluster
        cfg = cluster.config
        assert self._member is not None
        await cluster.ensure_topic()
        consumer = cluster.new_consumer(
            self.group,
            client_id=self._member.id,
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms,
            rebalance_timeout_ms=cfg.rebalance_timeout_ms,
            group_instance_id=cfg.group_instance_id or None,
            partition_assignment_strategy=self._assignors(),
            # Receivers poll per partition; a member that owns nothing polls nothing and
            # must not be expelled for it. Liveness is the heartbeat's job.
            max_poll_interval_ms=24 * 3600 * 1000,
            **raw_records(),  # the receivers read through it
        )
        await start_client(consumer, f"joining group {self.group!r}")
        cluster.outage.ok()
        self._track_heartbeats(consumer)
        self._consumer = consumer
        self.adapter.attach_group_consumer(self.group, consumer)
        consumer.subscribe([cluster.topic], listener=_Rebalance(self))
        if self._reporting is None:
            self._reporting = asyncio.create_task(self._report_loop(), name="kafka-group-report")

    def _assignors(self) -> tuple[type[Any], ...]:
        """The configured assignors; exchanging the app's handlers when known."""
        assert self._member is not None
        bases = [sticky_assignor() if name == "sticky" else RoundRobinPartitionAssignor
                 for name in self.adapter.cluster.config.assignors]
        if self._app is None:
            return tuple(bases)
        me = AppIdentity(self._member.id, self._member.host, *self._app)
        check = AppCheck(self.group, me)
        return tuple(checking_assignor(base, me, check.seen) for base in bases)

    async def _report_loop(self) -> None:
        """Report this daemon now and then, and at once when its queues change.

        Best effort: a report that fails is logged (throttled) and tried again at the
        next turn; it never stops the daemon.
        """
        assert self._member is not None
        while True:
            self._report_now.clear()
            stats = self._stats() if self._stats is not None else {}
            try:
                await self._reporter.write(self._member, sorted(self._owned), stats)
            except (ConveyorError, kafka_errors.KafkaError, OSError) as exc:
                self._report_log.log(logging.WARNING, "report",
                                     "group %s: reporting this daemon for `conveyor status` "
                                     "failed: %s", self.group, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._reporter.interval_s):
                    await self._report_now.wait()

    def _track_heartbeats(self, consumer: Any) -> None:
        """Note each heartbeat the coordinator answers (aiokafka keeps this private)."""

        def answered(sent: float) -> None:
            self._confirmed_at = max(self._confirmed_at, sent)

        if not observe_heartbeats(consumer, answered):
            log.warning("group %s: this aiokafka does not let heartbeats be observed; "
                        "a paused daemon is fenced only once its partitions are revoked",
                        self.group)
            self._confirmed_at = math.inf

    async def wait_assigned(self, timeout_s: float) -> bool:
        """Wait for the first assignment (tests, and callers that want a warm start)."""
        try:
            async with asyncio.timeout(timeout_s):  # wait_for can lose a cancel (3.11)
                await self._assigned_once.wait()
        except TimeoutError:
            return False
        return True

    async def _assigned(self, partitions: list[int]) -> None:
        async with self._changing:
            await self._acquire(partitions)

    async def _acquire(self, partitions: list[int]) -> None:
        assert self._listener is not None
        if self._stopping:
            return
        self._tell_past_total(partitions)
        mine = [p for p in partitions if p < self.total_queues and p not in self._owned]
        self._confirmed_at = max(self._confirmed_at, time.monotonic())  # SyncGroup answered
        self._owned.update(mine)
        await asyncio.gather(*(self._listener.queue_acquired(q, None) for q in mine))
        self._assigned_once.set()
        self._report_now.set()
        log.info("group %s assigned queues %s", self.group, sorted(self._owned))

    def _tell_past_total(self, partitions: list[int]) -> None:
        """Warn, once per partition, of those assigned past ``$.queues.total``.

        The topic gained partitions under running daemons (a start refuses such a
        topic), or members run with different totals. This daemon does not read them,
        and the coordinator gives them to no one else while it holds them: their records
        wait, not lost, until a member whose total covers them is assigned them (or the
        topic's retention deletes them)."""
        past = [p for p in partitions if p >= self.total_queues and p not in self._total_told]
        if not past:
            return
        self._total_told.update(past)
        log.warning("group %s was assigned partitions %s of topic %r, past $.queues.total "
                    "= %d: this daemon does not read them and no other member gets them "
                    "while it holds them, so their messages wait unhandled (until the "
                    "topic's retention deletes them); set $.queues.total to the topic's "
                    "partition count (at least %d) and restart the workers",
                    self.group, past, self.adapter.cluster.topic, self.total_queues,
                    max(past) + 1)

    async def _revoked(self, partitions: list[int]) -> None:
        """Drain (finish and commit) before the coordinator may hand the partitions on;
        stop at once if the session lapsed (they may be someone else's already).

        Every partition is drained at once: the group waits for the slowest, and each
        drain cancels its pull in flight rather than waiting for the fetch to return.
        """
        async with self._changing:
            await self._release(partitions)

    async def _release(self, partitions: list[int]) -> None:
        assert self._listener is not None
        gone = [p for p in partitions if p in self._owned]
        if not gone:
            return
        started = time.perf_counter()
        if time.monotonic() < self._confirmed_at + self._confirmed_for_s:
            await asyncio.gather(*(self._listener.queue_released(q) for q in gone))
            log.info("group %s: drained revoked queues %s in %.3fs", self.group, gone,
                     time.perf_counter() - started)
        else:
            log.warning("group %s: session lapsed; dropping queues %s undrained",
                        self.group, gone)
            await asyncio.gather(*(self._listener.queue_lost(q) for q in gone))
        self._owned.difference_update(gone)
        self._report_now.set()

    async def stop(self) -> None:
        self._stopping = True
        if self._joining is not None:
            with contextlib.suppress(Exception):  # logged when it ended
                await cancel_and_wait(self._joining)
        if self._reporting is not None:
            await cancel_and_wait(self._reporting)
            self._reporting = None
        if self._consumer is None:
            return
        # Drain while still a member (commits need the live generation), then leave.
        # An assignment under way (a stop signal as the group re-balances) is waited for,
        # so the queues it acquires are drained here too: released before their agents
        # existed, they were drained only after the LeaveGroup, when the group may
        # already have given them to another member (tests/integration/kafka/
        # test_kafka_group_stop.py).
        if self._listener is not None:
            async with self._changing:
                await self._release(sorted(self._owned))
        if self._member is not None:  # status stops showing it at once
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._reporter.leave(self._member.id)
        self.adapter.attach_group_consumer(self.group, None)
        member_id, generation = membership(self._consumer)
        with contextlib.suppress(Exception):
            # Sends LeaveGroup itself if the generation is above 0 — and never for a
            # static member, whose partitions wait session_timeout_ms for its return.
            await self._consumer.stop()
        self._consumer = None
        cluster = self.adapter.cluster
        if generation == 0 and member_id and not cluster.config.group_instance_id:
            await kafka_groups.leave_group(cluster, self.group, member_id)

    def owned(self) -> list[int]:
        return sorted(self._owned)

    def owned_until(self, queue: int) -> float:
        if queue not in self._owned:
            return -math.inf
        return self._confirmed_at + self._confirmed_for_s

    def joined(self) -> bool:
        """A member of the group: the coordinator has answered with an assignment (maybe
        empty); false while the broker is unreachable at the start."""
        return self._assigned_once.is_set()


def from_config(config: Config, group: str, adapter: QueueAdapter) -> KafkaGroupBalancer:
    if not isinstance(adapter, KafkaAdapter):
        raise ConfigError(
            f"$.balancer.kind = 'kafka-group' needs the kafka adapter, not {adapter.name!r}"
        )
    return KafkaGroupBalancer(adapter, group, config.queues.total)


async def group_members(adapter: QueueAdapter, group: str) -> list[GroupMember]:
    """Who runs ``group`` on this balancer, for ``conveyor status`` (its member source:
    the coordinator's members joined to the daemons' reports, see
    :mod:`conveyor.adapters.kafka.members`)."""
    if not isinstance(adapter, KafkaAdapter):
        raise ConfigError(
            f"$.balancer.kind = 'kafka-group' needs the kafka adapter, not {adapter.name!r}"
        )
    return await kafka_members.group_members(adapter.cluster, group)
