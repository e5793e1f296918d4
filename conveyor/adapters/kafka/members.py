"""Who runs an app on the ``kafka-group`` balancer, for ``conveyor status``.

Two sources, because brokers differ:

* **The group coordinator** (DescribeGroups): which members the group has now and, on
  Apache Kafka, each member's assignment (the consumer protocol's bytes). tansu, the
  test broker, answers with member ids only — no client id, host, metadata or
  assignment.
* **The daemons' own reports**: each daemon of a ``kafka-group`` app writes a record
  to ``<topic>.conveyor-members`` (one partition, ``cleanup.policy=compact``; key =
  ``APP/MEMBER``, value = a JSON :class:`MemberReport`: host, pid, version, the queues it owns
  and the stats snapshot ``status`` shows) when its queues change and every
  ``max(1 s, heartbeat_interval_ms)``, and a tombstone when it leaves.

:func:`group_members` joins them. A member is live when the coordinator lists it: a
Kafka member id is the client id the daemon joined with (its own member id) followed by
``-`` and the coordinator's suffix. A report of a daemon the coordinator no longer
lists (it died or left) is dropped; a member without a report (a daemon still
starting, or another client in the group) is shown with what the coordinator knows.
Queue owners are the coordinator's assignment where it gives one, else the owner's
report. When the coordinator cannot be asked, reports newer than the session timeout
count.

Only the last ``window`` records are read: live daemons report every few seconds, so
what is older is of daemons long gone, and a topic the broker does not compact never
makes ``status`` slower.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from aiokafka import TopicPartition
from aiokafka import errors as kerrors

from conveyor.adapters.kafka.aiokafka_internals import assignment
from conveyor.adapters.kafka.cluster import KafkaCluster
from conveyor.adapters.kafka.connection import kafka_errors
from conveyor.platform.balancing.membership import MemberInfo

log = logging.getLogger("conveyor.kafka")

TOPIC_CONFIG = {"cleanup.policy": "compact"}


class MemberReport(msgspec.Struct, frozen=True):
    """What a daemon says of itself; ``at`` is its clock when it wrote this."""

    id: str
    host: str
    pid: int
    started_at: float
    queues: list[int]
    stats: dict[str, float]
    at: float
    version: str = ""
    """The daemon's Conveyor version; absent from a report of an older daemon."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(MemberReport).decode


def members_topic(cluster: KafkaCluster) -> str:
    return f"{cluster.topic}.conveyor-members"


def _key(group: str, member_id: str) -> bytes:
    return f"{group}/{member_id}".encode()


class MemberReporter:
    """A daemon's side: writes its reports (see the module docstring)."""

    def __init__(self, cluster: KafkaCluster, group: str) -> None:
        self.cluster = cluster
        self.group = group
        self.topic = members_topic(cluster)
        self.interval_s = max(1.0, cluster.config.heartbeat_interval_ms / 1000)
        self._ready = False

    async def write(self, member: MemberInfo, queues: list[int],
                    stats: Mapping[str, float]) -> None:
        report = MemberReport(member.id, member.host, member.pid, member.started_at,
                              queues, dict(stats), time.time(), member.version)
        await self._send(_key(self.group, member.id), _encode(report))

    async def leave(self, member_id: str) -> None:
        """A tombstone: this daemon is gone (compaction then drops its reports)."""
        await self._send(_key(self.group, member_id), None)

    async def _send(self, key: bytes, value: bytes | None) -> None:
        if not self._ready:
            await self.cluster.producer()  # the app's topic first
            await self.cluster.create_topics({self.topic: 1}, TOPIC_CONFIG)
            self._ready = True
        producer = await self.cluster.producer(self.topic)
        await producer.send_and_wait(self.topic, value, key=key, partition=0)


@dataclass(frozen=True)
class GroupMember:
    """One live member as status shows it; ``queues`` are those it owns."""

    info: MemberInfo
    queues: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Described:
    """One member as the coordinator describes it."""

    member_id: str
    client_id: str
    host: str
    queues: list[int] | None
    """The coordinator's assignment on our topic; None when it gives none (tansu)."""


async def group_members(cluster: KafkaCluster, group: str,
                        window: int = 2000) -> list[GroupMember]:
    """The group's live members, ordered by id, with the queues each owns."""
    described = await _describe(cluster, group)
    reports = await _reports(cluster, group, window)
    return join(described, reports, time.time(), cluster.config.session_timeout_ms / 1000)


def join(described: list[Described] | None, reports: Mapping[str, MemberReport],
         now: float, fresh_s: float) -> list[GroupMember]:
    """The coordinator's members (``None``: it could not be asked) joined to the reports
    (see the module docstring), ordered by id."""
    out: dict[str, GroupMember] = {}
    if described is None:  # the coordinator cannot be asked: trust fresh reports
        for r in reports.values():
            if now - r.at <= fresh_s:
                out[r.id] = GroupMember(_info(r), sorted(r.queues))
        return sorted(out.values(), key=lambda m: m.info.id)
    for d in described:
        report = _report_of(d, reports)
        if report is not None:
            queues = d.queues if d.queues is not None else report.queues
            out[report.id] = GroupMember(_info(report), sorted(queues))
        else:
            name = d.client_id or d.member_id
            out[name] = GroupMember(MemberInfo(name, d.host, 0, 0.0), sorted(d.queues or []))
    return sorted(out.values(), key=lambda m: m.info.id)


def _info(report: MemberReport) -> MemberInfo:
    return MemberInfo(report.id, report.host, report.pid, report.started_at,
                      dict(report.stats), report.version)


def _report_of(d: Described, reports: Mapping[str, MemberReport]) -> MemberReport | None:
    if d.client_id in reports:
        return reports[d.client_id]
    client, sep, _ = d.member_id.rpartition("-")
    # The coordinator's suffix is a UUID, which has dashes of its own: try each cut.
    while sep:
        if client in reports:
            return reports[client]
        client, sep, _ = client.rpartition("-")
    return None


async def _describe(cluster: KafkaCluster, group: str) -> list[Described] | None:
    """The coordinator's members of ``group``; None if it cannot be described.

    A cluster that cannot be reached at all (the admin client does not start: no
    broker answers, or none lets it log in) is raised, not None: the reports are read
    through the same cluster, and would wait as long again for nothing."""
    with kafka_errors(f"reading the members of {group!r}"):
        async with cluster.admin():  # started here, kept for the describe and the reports
            pass
    try:
        async with cluster.admin() as admin:
            [response] = await admin.describe_consumer_groups([group])
        [described] = response.to_object()["groups"]
    except (kerrors.KafkaError, OSError, ValueError) as exc:
        log.debug("cannot describe group %r: %s", group, exc)
        return None
    if described["error_code"]:
        return None
    return [Described(m["member_id"], m["client_id"], m["client_host"].lstrip("/"),
                       _assigned(cluster, m["member_assignment"]))
            for m in described["members"]]


def _assigned(cluster: KafkaCluster, raw: bytes) -> list[int] | None:
    """The coordinator's assignment on our topic; None when it sent none (tansu)."""
    return sorted(assigned_partitions(raw, cluster.topic)) if raw else None


def assigned_partitions(raw: bytes | None, topic: str) -> set[int]:
    """The partitions of ``topic`` in a member's assignment; none if it cannot be read."""
    if not raw:
        return set()
    try:
        partitions = assignment(raw)
    except Exception:  # another protocol's bytes: not a consumer this check can read
        return set()
    return {tp.partition for tp in partitions if tp.topic == topic}


async def _reports(cluster: KafkaCluster, group: str, window: int) -> dict[str, MemberReport]:
    """The latest report of each member of ``group`` in the last ``window`` records."""
    topic = members_topic(cluster)
    tp = TopicPartition(topic, 0)
    prefix = f"{group}/".encode()
    latest: dict[str, MemberReport | None] = {}
    with kafka_errors(f"reading the member reports of {group!r}"):
        async with cluster.admin() as admin:
            if topic not in await admin.list_topics():
                return {}
        # (a header name not UTF-8: read, the reader takes records as the batch holds them)
        async with cluster.reading(topic, [0]) as consumer:
            begin = int((await consumer.beginning_offsets([tp]))[tp])
            end = await cluster.high_watermark(consumer, tp, begin)
            position = max(begin, end - window)
            consumer.seek(tp, position)
            empty = 0
            while position < end and empty < 10:  # 5 s without data: show what was read
                batch = (await consumer.getmany(tp, timeout_ms=500, max_records=500)).get(tp, [])
                empty = 0 if batch else empty + 1
                for record in batch:
                    position = record.offset + 1
                    if record.key is None or not record.key.startswith(prefix):
                        continue
                    try:
                        member = record.key[len(prefix):].decode()
                        latest[member] = None if record.value is None else _decode(record.value)
                    except (UnicodeDecodeError, msgspec.DecodeError):  # another client's
                        log.debug("member report %r does not decode", record.key)
    return {member: r for member, r in latest.items() if r is not None}
