"""One app's topic on one Kafka cluster: what the adapter and its helpers reach it through.

:class:`KafkaCluster` holds the configuration, the topic names, the client options and
the connections they share — the producer (started once, creating the topic first),
consumers made to order, the probe consumers that read lag and positions, and admin
clients (:meth:`KafkaCluster.admin`). It prepares the topic (created if absent, its
partition count checked against ``$.queues.total``) and notices the topic being deleted
or re-created under a running worker (:meth:`KafkaCluster.topic_gone`).

The adapter (:mod:`conveyor.adapters.kafka.adapter`) owns one and hands it to the
receivers and to the helpers (hand-offs, dead letters, groups, member reports, rewind),
so none of them needs the adapter.

Lag is ``high watermark - committed``, the high watermark taken from fetch responses
(tansu's ListOffsets(latest) is wrong for multi-record batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka import offsets as kafka_offsets
from conveyor.adapters.kafka.aiokafka_internals import (
    drop_pending,
    fetch_committed,
    is_idempotent,
    raw_records,
)
from conveyor.adapters.kafka.connection import (
    client_options,
    close_admin,
    first_answer,
    kafka_errors,
    outage_log,
    retrying,
    start_admin,
    start_client,
    start_producer,
)
from conveyor.platform.config import KafkaConfig
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    ConveyorError,
    ShutdownError,
    error_text,
)
from conveyor.platform.tasks import cancel_and_wait

log = logging.getLogger("conveyor.kafka")

_CLEANUP = "cleanup.policy"
_RETENTION = ("retention.ms", "retention.bytes")
"""The settings that delete a topic's records by age or size (-1: never)."""
QUICK_FETCH_MS = 1
"""``fetch_max_wait_ms`` of the consumers :meth:`KafkaCluster._lend` keeps: the broker
answers a fetch at a partition's end after this long (tansu never answers one of 0)."""
_ANSWER_CHECK_MS = 10
"""How often :meth:`KafkaCluster.high_watermark` looks for the fetch answer it waits for."""
_TOPIC_EXISTS = 36
"""CreateTopics' error code for a topic another process created meanwhile."""
UNPARSED_BATCH = (kerrors.CorruptRecordException, kerrors.UnsupportedCodecError)
"""What aiokafka raises for a fetched batch it cannot read (a wrong CRC, which a broker
that does not check one stores; a codec not installed): on every fetch of it again."""


def _duration(ms: int) -> str:
    """``ms`` the way an operator sizes retention: ``7d``, ``36h``, ``90s``, ``250ms``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if (ms >= size and ms % size == 0) or ms >= 10 * size:
            return f"{ms / size:g}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class TopicRisk:
    """A dead-letter topic set to delete what it keeps (:meth:`KafkaCluster.
    letter_topic_risks`)."""

    topic: str
    kind: Literal["compacted", "retention", "unknown"]
    """``compacted``: refused at a start; ``retention``: a warning; ``unknown``: the
    broker did not tell (logged once an episode by :meth:`KafkaCluster.topic_settings`)."""
    found: str
    """The setting, as the broker names it: ``retention.ms=604800000``."""
    warning: str
    """One line: the topic, what the setting deletes, what to do."""


class TopicMissingError(BrokerError):
    """The queues' topic does not exist, and the caller only reads (:meth:`KafkaCluster.
    require_topic`): nothing was published or run under this config yet."""


class KafkaCluster:
    """The topic ``config.topic`` with ``total_queues`` partitions, and the connections
    to reach it (see the module's docstring). One per adapter; safe to share between
    its tasks (the producer and the topic preparation are started once)."""

    def __init__(self, config: KafkaConfig, total_queues: int, *,
                 new_group_start: str = "earliest",
                 request_timeout_ms: int | None = None) -> None:
        self.config = config
        self.topic = config.topic
        self.total_queues = total_queues
        self.new_group_start = new_group_start
        """``[queues] new_group_start``: where a group with no committed offset starts."""
        self.options = client_options(config)
        """Connection options every aiokafka client takes (secrets read from the env)."""
        if request_timeout_ms is not None:  # else aiokafka's 40 s (a daemon's clients)
            self.options["request_timeout_ms"] = request_timeout_ms
        self.outage = outage_log(config.bootstrap)
        self.idempotent = False
        """Whether the producer is idempotent (known once it has started)."""
        self.topic_changed: BrokerError | None = None
        """Set once a receiver finds the topic deleted or re-created under it: from then
        on no receiver reads or commits (see :meth:`topic_gone`)."""
        self.on_topic_changed: Callable[[BrokerError], None] | None = None
        """Told :attr:`topic_changed` (the kafka-group balancer fails the daemon)."""
        self.unanswered: dict[str, str] = {}
        """Topic -> why DescribeConfigs gave no ``cleanup.policy`` for it, while it gives
        none: the warning is logged once an episode, not at every check."""
        self._producer: AIOKafkaProducer | None = None
        self._tracked: set[str] = set()
        """Topics the producer's metadata is told to follow (:meth:`producer`)."""
        self._abandoning = False
        """:meth:`abandon_sends` was called: :meth:`close` drops what the producer holds."""
        self._lock = asyncio.Lock()
        self._topic_ready = False
        self._preparing: asyncio.Task[None] | None = None
        self._first_answer_awaited = False
        self._kept: dict[tuple[str, str], AIOKafkaConsumer] = {}
        """The consumers :meth:`_lend` keeps: probes by group, readers by topic."""
        self._lent: dict[tuple[str, str], asyncio.Lock] = {}
        self._admin: AIOKafkaAdminClient | None = None
        self._admin_lock = asyncio.Lock()
        self._admin_users = 0
        """Blocks of :meth:`admin` under way."""
        self._retired: list[AIOKafkaAdminClient] = []
        """Admin clients a failure retired, closed when no block uses them."""

    @property
    def dlq_topic(self) -> str:
        """Every app's dead letters on this topic (see :mod:`conveyor.platform.letters`)."""
        return f"{self.topic}.conveyor-dlq"

    @property
    def dlq_ops_topic(self) -> str:
        """What was done to the dead letters (:mod:`conveyor.adapters.kafka.letters`)."""
        return f"{self.topic}.conveyor-dlq-ops"

    # -- connections -------------------------------------------------------------------
    def new_consumer(self, group: str | None, **extra: Any) -> AIOKafkaConsumer:
        """A consumer (not started) of ``group``, committing only when told to."""
        opts: dict[str, Any] = {
            "group_id": group,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": self.config.fetch_max_wait_ms,
            "max_poll_records": 1000,
            **self.options,
            **extra,
        }
        return AIOKafkaConsumer(**opts)

    @contextlib.asynccontextmanager
    async def admin(self) -> AsyncIterator[AIOKafkaAdminClient]:
        """``async with cluster.admin() as client:`` — the cluster's admin client, started
        on first use and kept until :meth:`close`, so that a command or a console poll
        asking several things does not connect and read the metadata for each.

        A block that raises anything but Conveyor's own errors (a broker error, a time-out,
        a cancellation) retires it: the next block starts a new one rather than reuse a
        client the failure may have left half-broken, and the retired one is closed once
        no block uses it. Blocks may nest (a describe that fails inside a listing) and
        run concurrently."""
        async with self._admin_lock:  # started once, however many blocks ask at once
            if self._admin is None:
                self._admin = await start_admin(self.options)
            client = self._admin
        self._admin_users += 1
        try:
            yield client
        except ConveyorError:
            raise
        except BaseException:
            if self._admin is client:
                self._admin = None
                self._retired.append(client)
            raise
        finally:
            self._admin_users -= 1
            if not self._admin_users:
                retired, self._retired = self._retired, []
                for old in retired:
                    await close_admin(old)

    def reading(self, topic: str, partitions: Sequence[int]
                ) -> AbstractAsyncContextManager[AIOKafkaConsumer]:
        """``async with cluster.reading(topic, partitions) as consumer:`` — a consumer of no
        group assigned ``partitions`` of ``topic``, its records as the batch holds them
        (``raw_records``), lent as :meth:`_lend` says: reading the groups' positions or the
        member reports at every status reading does not connect again."""
        tps = {TopicPartition(topic, p) for p in partitions}
        return self._lend(("reader", topic), None, tps)

    def probing(self, group: str) -> AbstractAsyncContextManager[AIOKafkaConsumer]:
        """``async with cluster.probing(group) as consumer:`` — a consumer of ``group``
        assigned every partition, for lag and rewind (whose scan of timestamps reads
        records as the batch holds them: a header name not UTF-8 does not fail it), lent
        as :meth:`_lend` says. Raises :class:`TopicMissingError` where the topic does not
        exist: reading creates no topic."""
        tps = {TopicPartition(self.topic, q) for q in range(self.total_queues)}
        return self._lend(("probe", group), group, tps)

    @contextlib.asynccontextmanager
    async def _lend(self, key: tuple[str, str], group: str | None,
                    tps: set[TopicPartition]) -> AsyncIterator[AIOKafkaConsumer]:
        """A started consumer for the block, kept until :meth:`close` (one per ``key``,
        lent to one block at a time) and assigned ``tps``.

        Its fetches are answered at once (:data:`QUICK_FETCH_MS`: a read of a partition
        at its end costs a round trip, not the broker's long-poll wait) and it fetches only
        during a block: between blocks its partitions are paused, so a kept consumer does
        not poll the broker while idle. Assigned again only when asked for other
        partitions (see :meth:`KafkaDeadLetters._on`: a re-assignment then a stop can
        hang aiokafka's fetcher). A block that raises anything but Conveyor's own errors
        (a broker error, a time-out, a cancellation) stops it; the next block starts a
        new one rather than reuse a consumer the failure may have left half-broken."""
        async with self._lent.setdefault(key, asyncio.Lock()):
            kept = self._kept.get(key)
            consumer = kept if kept is not None else await self._keep(key, group)
            try:
                if consumer.assignment() != tps:
                    consumer.assign(sorted(tps))
                consumer.resume(*tps)
                yield consumer
            except ConveyorError:
                raise
            except BaseException:
                del self._kept[key]
                with contextlib.suppress(Exception):
                    await consumer.stop()
                raise
            finally:
                if key in self._kept:  # (not stopped above): idle until the next block
                    consumer.pause(*consumer.assignment())

    async def _keep(self, key: tuple[str, str], group: str | None) -> AIOKafkaConsumer:
        if key[0] == "probe":
            await self.require_topic()
        consumer = self.new_consumer(group, fetch_max_wait_ms=QUICK_FETCH_MS, **raw_records())
        await start_client(consumer, "connecting a consumer")
        self._kept[key] = consumer
        return consumer

    async def producer(self, topic: str | None = None) -> AIOKafkaProducer:
        """The shared producer, started on first use (after the topic is prepared), its
        metadata following the topic and ``topic`` (one the caller has created and
        writes to: a letter topic, the members' or the hand-offs').

        Told explicitly: aiokafka's producer adds a topic to those its metadata requests
        name only when its metadata lacks the topic, and every later request names just
        those, replacing what it knew. The app's topic, known from a request that named
        every topic, was never added; once the members' topic (created after the
        producer started) was, the app's topic fell out of the producer's metadata and a
        publish to it waited for a leader until it timed out (``NotLeaderForPartition``
        after 40 s: a startup hook's first publish on a fresh broker, about a third of
        the runs)."""
        producer = self._producer
        if producer is None:
            async with self._lock:
                if self._producer is None:
                    await self.ensure_topic()
                    started = await start_producer(self.config, self.options)
                    self.idempotent = is_idempotent(started)
                    self._tracked = {self.topic}
                    started.client.add_topic(self.topic)
                    self._producer = started
            producer = self._producer
            assert producer is not None
        if topic is not None and topic not in self._tracked:
            self._tracked.add(topic)
            producer.client.add_topic(topic)
        return producer

    @property
    def started_producer(self) -> AIOKafkaProducer | None:
        """The shared producer if it has started (this starts nothing)."""
        return self._producer

    def abandon_sends(self) -> None:
        """Have :meth:`close` drop what the producer holds rather than wait to deliver it
        (``KafkaAdapter.close``: records whose callers are gone)."""
        self._abandoning = True

    async def close(self) -> None:
        if self._abandoning and self._producer is not None:
            with contextlib.suppress(Exception):
                await drop_pending(self._producer, ShutdownError(
                    "the client closed while this send was under way, after its caller "
                    "had gone: it may or may not be stored"))
        if self._preparing is not None and not self._preparing.done():
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._preparing)
        for consumer in [*self._kept.values()]:
            with contextlib.suppress(Exception):
                await consumer.stop()
        self._kept.clear()
        clients = [*self._retired, *([self._admin] if self._admin is not None else [])]
        self._admin, self._retired = None, []
        for client in clients:
            await close_admin(client)
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
            self._tracked = set()

    # -- the topic ---------------------------------------------------------------------
    async def ensure_topic(self) -> None:
        """Create the topic with ``total_queues`` partitions if absent; check it if present."""
        if self._topic_ready:
            return
        await self.create_topics({self.topic: self.total_queues})
        self._topic_ready = True

    async def require_topic(self) -> None:
        """Check the topic as :meth:`ensure_topic` does, without creating it: raise
        :class:`TopicMissingError` where it does not exist. For the commands that only
        read (``status``, ``rewind``): creating it there left a topic behind for a typo
        in ``[kafka] topic``."""
        if self._topic_ready:
            return
        with kafka_errors("reading the topic"):
            async with self.admin() as client:
                if self.topic not in set(await client.list_topics()):
                    raise TopicMissingError(
                        f"kafka topic {self.topic!r} does not exist: nothing was published "
                        "and no worker ran under this config (check $.kafka.topic)")
                await self.check_partitions(client)
                await self.check_cleanup_policy(client)
        self._topic_ready = True

    async def topic_exists(self) -> bool:
        """Whether the broker lists the topic now (one metadata request)."""
        with kafka_errors("reading the topic"):
            async with self.admin() as client:
                return self.topic in set(await client.list_topics())

    async def wait_topic_ready(self, timeout_s: float | None) -> bool:
        """Whether the topic is ready, after waiting at most ``timeout_s`` for it.

        One task per cluster prepares the topic, backing off while the broker is down
        (:func:`~conveyor.adapters.kafka.connection.retrying`), however many receivers
        wait. ``None`` waits for a first answer
        (:func:`~conveyor.adapters.kafka.connection.first_answer`), once per cluster; later
        calls with ``None`` do not wait.
        A non-retriable failure (a topic with too few partitions) is raised.
        """
        if self._topic_ready:
            return True
        task = self._preparing
        if task is None:
            task = self._preparing = asyncio.create_task(
                retrying(self.outage, "preparing the topic", self.ensure_topic),
                name="kafka-prepare-topic",
            )
        if not task.done():
            if timeout_s is None:
                if not self._first_answer_awaited:  # one start-up wait, not one per queue
                    self._first_answer_awaited = True
                    await first_answer(task, self.outage)
            elif timeout_s > 0:
                await asyncio.wait([task], timeout=timeout_s)
        if not task.done():
            return False
        task.result()
        return True

    async def create_topics(
        self, wanted: dict[str, int], topic_config: dict[str, str] | None = None
    ) -> None:
        """Create the topics of ``wanted`` (name: partitions) that are absent."""
        with kafka_errors("preparing topics"):
            async with self.admin() as client:
                existing = set(await client.list_topics())
                missing = {t: n for t, n in wanted.items() if t not in existing}
                if missing and self.config.create_topic:
                    rf = self.config.replication_factor
                    topics = [NewTopic(t, n, rf, topic_configs=topic_config)
                              for t, n in missing.items()]
                    response = await client.create_topics(topics)
                    for topic, code, *_ in response.topic_errors:
                        if code not in (0, _TOPIC_EXISTS):
                            raise BrokerError(
                                f"kafka: creating topic {topic!r} failed (error {code})"
                            )
                elif missing:
                    raise ConfigError(f"kafka topic(s) {sorted(missing)} do not exist and "
                                      "$.kafka.create_topic is false")
                if self.topic in wanted and self.topic in existing:
                    await self.check_partitions(client)
                if "compact" not in (topic_config or {}).get(_CLEANUP, ""):
                    for topic in wanted:  # (the hand-off and members topics: compacted)
                        await self.check_cleanup_policy(client, topic)

    async def check_partitions(self, client: AIOKafkaAdminClient) -> None:
        """Refuse (:class:`ConfigError`, naming both numbers and ``$.queues.total``) the
        existing topic when its partition count is not ``total_queues``: with fewer, the
        ring sends to partitions that do not exist; with more, records there are read by
        no daemon and counted by no lag (docs/kafka.md, "Topic drift")."""
        if (drift := await self.partition_drift(client)) is not None:
            raise ConfigError(drift)

    async def partition_drift(self, client: AIOKafkaAdminClient) -> str | None:
        """Why the existing topic's partition count is not ``total_queues`` (one line,
        naming both numbers and ``$.queues.total``); None where it is."""
        described = await client.describe_topics([self.topic])
        have = len(described[0]["partitions"])
        if have < self.total_queues:
            return (f"kafka topic {self.topic!r} has {have} partitions but "
                    f"$.queues.total is {self.total_queues}; add partitions or lower it")
        if have > self.total_queues:  # records there would never be read
            return (f"kafka topic {self.topic!r} has {have} partitions but "
                    f"$.queues.total is {self.total_queues}: partitions "
                    f"{self.total_queues}-{have - 1} would never be read; set "
                    f"$.queues.total = {have}")
        return None

    async def check_cleanup_policy(self, client: AIOKafkaAdminClient,
                                   topic: str | None = None) -> None:
        """Refuse (:class:`ConfigError`) ``topic`` (the queues' by default) where the
        broker compacts it: compaction keeps only the last record of each key, and what
        each of Conveyor's topics keys by loses records that are still needed
        (:meth:`compaction_loses`; docs/kafka.md, "Topic drift"). A broker that does not
        answer DescribeConfigs is let be, with a warning."""
        topic = self.topic if topic is None else topic
        policy = await self.cleanup_policy(client, topic)
        if policy is not None and "compact" in policy.split(","):
            raise ConfigError(self.compaction_loses(topic, policy))

    async def cleanup_policy(self, client: AIOKafkaAdminClient, topic: str, *,
                             quiet: bool = False) -> str | None:
        """``topic``'s ``cleanup.policy`` as the broker reports it (``""`` where it names
        none); None where DescribeConfigs fails (:meth:`topic_settings`)."""
        settings = await self.topic_settings(client, topic, quiet=quiet)
        return None if settings is None else settings.get(_CLEANUP, "")

    async def topic_settings(self, client: AIOKafkaAdminClient, topic: str, *,
                             quiet: bool = False) -> dict[str, str] | None:
        """``topic``'s settings as the broker reports them (name: value; a real Kafka
        names every one, defaults included, tansu only those set on the topic); None
        where DescribeConfigs fails (why: :attr:`unanswered`), with a warning the first
        time in a row unless ``quiet``."""
        try:
            answers = await client.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)])  # every setting:
            # tansu drops the connection when asked for named ones
            entries = [e for a in answers for r in a.resources if not r[0] for e in r[4]]
        except kerrors.KafkaError as exc:
            if topic not in self.unanswered and not quiet:
                log.warning("kafka: could not read the cleanup.policy of topic %r (%s); a "
                            "compacted topic deletes records before they are read", topic,
                            exc)
            self.unanswered[topic] = error_text(exc)
            return None
        self.unanswered.pop(topic, None)
        return {str(e[0]): str(e[1]) for e in entries if e[1] is not None}

    def compaction_loses(self, topic: str, policy: str) -> str:
        """What compacting ``topic`` deletes, and what to do, in one line."""
        fix = (f"set cleanup.policy=delete (kafka-configs --alter --entity-type topics "
               f"--entity-name {topic} --add-config cleanup.policy=delete)")
        if topic == self.dlq_topic:
            return (f"kafka topic {topic!r} (dead letters) has cleanup.policy={policy}: "
                    "compaction keeps only the last letter of each stream key, deleting "
                    f"the others before anyone read, replayed or purged them; {fix}")
        if topic == self.dlq_ops_topic:
            return (f"kafka topic {topic!r} (what dlq replay and purge did) has "
                    f"cleanup.policy={policy}: compaction keeps only each app's last "
                    "record, so purged and replayed letters would be listed, and "
                    f"replayed, again; {fix}")
        return (f"kafka topic {topic!r} has cleanup.policy={policy}: compaction keeps "
                "only the last record of each stream key, deleting a stream's earlier "
                f"messages handled or not; {fix} or use another topic")

    async def letter_topic_risks(self, *, quiet: bool = False) -> list[TopicRisk]:
        """What the broker's settings of the dead-letter topics (letters, ops) that exist
        cost: compaction (refused), a finite retention (reported), a policy it did not
        tell (:meth:`topic_settings`, ``quiet`` passed on). One admin client."""
        risks: list[TopicRisk] = []
        with kafka_errors("reading the dead-letter topics' settings"):
            async with self.admin() as client:
                existing = set(await client.list_topics())
                for topic in (self.dlq_topic, self.dlq_ops_topic):
                    if topic in existing:
                        settings = await self.topic_settings(client, topic, quiet=quiet)
                        risks += self._letter_topic_risks(topic, settings)
        return risks

    def _letter_topic_risks(self, topic: str, settings: dict[str, str] | None
                            ) -> list[TopicRisk]:
        if settings is None:
            holds = ("dead letters" if topic == self.dlq_topic
                     else "records of what dlq replay and purge did")
            return [TopicRisk(topic, "unknown", "cleanup.policy unknown", (
                f"kafka: could not read the cleanup.policy of topic {topic!r} "
                f"({self.unanswered.get(topic, '?')}): if the broker compacts it, it "
                f"deletes {holds}; check it with kafka-configs --describe --entity-type "
                f"topics --entity-name {topic}"))]
        risks = []
        policy = settings.get(_CLEANUP, "")
        if "compact" in policy.split(","):
            risks.append(TopicRisk(topic, "compacted", f"{_CLEANUP}={policy}",
                                   self.compaction_loses(topic, policy)))
        for name in _RETENTION:
            value = settings.get(name, "-1")
            if value.isascii() and value.isdigit():  # a number from 0 (-1: none)
                risks.append(TopicRisk(topic, "retention", f"{name}={value}",
                                       self.retention_loses(topic, name, int(value))))
        return risks

    def retention_loses(self, topic: str, name: str, value: int) -> str:
        """What a finite ``retention.ms`` or ``retention.bytes`` on letter topic
        ``topic`` deletes, and what to do, in one line: not refused (an operator may
        mean to keep letters a week), never silent."""
        when = (f"{_duration(value)} after it was stored" if name == "retention.ms"
                else f"once the partition holds more than {value:,} bytes, oldest first")
        fix = (f"set {name}=-1 (kafka-configs --alter --entity-type topics --entity-name "
               f"{topic} --add-config {name}=-1) unless that is meant")
        if topic == self.dlq_topic:
            return (f"kafka topic {topic!r} (dead letters) has {name}={value}: the broker "
                    f"deletes each letter {when}, whether or not anyone read, replayed or "
                    f"purged it; {fix}")
        return (f"kafka topic {topic!r} (what dlq replay and purge did) has {name}="
                f"{value}: the broker deletes each record {when}, and the letters it "
                f"purged or replayed, still in {self.dlq_topic!r}, are then listed, and "
                f"replayed, again; {fix}")

    def topic_gone(self, queue: int, end: int, reached: int) -> None:
        """Partition ``queue`` ends at ``end``, before the offset ``reached`` this process
        had already read or acknowledged: the topic was deleted (and maybe re-created)
        under it. The group's committed offsets went with the old topic, so a worker
        started now reads the new one from its start; this one reads and commits nothing
        more, and says so once (through :attr:`on_topic_changed` if set, else a log)."""
        if self.topic_changed is not None:
            return
        self.topic_changed = BrokerError(
            f"kafka topic {self.topic!r} was deleted or re-created under this worker "
            f"(partition {queue} ends at offset {end}, before offset {reached} it had "
            "reached): nothing more is read or committed; restart the workers, they read "
            "the new topic from its start")
        if self.on_topic_changed is not None:
            self.on_topic_changed(self.topic_changed)
        else:
            log.error("%s", self.topic_changed)

    # -- positions ---------------------------------------------------------------------
    async def new_group_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition, *,
                               commit: bool = False) -> int:
        """Where ``consumer``'s group, which committed nothing on ``tp``, starts: the
        partition's first offset, or with ``new_group_start = "latest"`` its high
        watermark — then committed with ``commit``, so that a daemon stopped before its
        first acknowledgement does not move the start to a later end."""
        start = int((await consumer.beginning_offsets([tp]))[tp])
        if self.new_group_start != "latest":
            return start
        start = await self.high_watermark(consumer, tp, start)
        if commit:
            try:
                await consumer.commit({tp: OffsetAndMetadata(start, "")})
            except (kerrors.CommitFailedError, kerrors.IllegalStateError) as exc:
                log.warning("%s: could not record the new group's start %d (%s)", tp, start,
                            exc)
        return start

    async def high_watermark(self, consumer: AIOKafkaConsumer, tp: TopicPartition,
                             from_offset: int, timeout_s: float = 5.0) -> int:
        """The partition's high watermark, as a fetch response reports it
        (:meth:`high_watermarks`)."""
        return (await self.high_watermarks(consumer, {tp: from_offset}, timeout_s))[tp]

    async def high_watermarks(self, consumer: AIOKafkaConsumer,
                              from_offsets: Mapping[TopicPartition, int],
                              timeout_s: float = 5.0) -> dict[TopicPartition, int]:
        """Each partition's high watermark, as a fetch from its offset in ``from_offsets``
        reports it: one fetch request asks for them all. Only answers that arrived after
        this call began count (a consumer kept between calls holds older ones); records
        the fetches bring are dropped (the caller seeks where it reads).

        A batch at an offset that cannot be parsed (its CRC wrong, its codec missing)
        still came with the watermark: the queue is stuck behind it, and its lag is what
        says so."""
        since_ms = int(time.time() * 1000)  # aiokafka stamps each answer so
        for tp, offset in from_offsets.items():
            consumer.seek(tp, offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        waiting = set(from_offsets)
        found: dict[TopicPartition, int] = {}
        while True:
            with contextlib.suppress(*UNPARSED_BATCH):  # the watermark came with it
                await consumer.getmany(*waiting, timeout_ms=_ANSWER_CHECK_MS,
                                       max_records=10_000)
            for tp in list(waiting):
                high = consumer.highwater(tp)
                answered = consumer.last_poll_timestamp(tp)
                if high is not None and answered is not None and answered >= since_ms:
                    found[tp] = int(high)
                    waiting.discard(tp)
            if not waiting:
                return found
            if loop.time() > deadline:
                raise BrokerConnectionError(
                    f"kafka: no fetch response for {min(waiting)} in {timeout_s}s")

    async def lag(self, queue: int, group: str) -> int:
        """Messages of ``queue`` that ``group`` has not finished, from the broker's view
        (none where the topic does not exist)."""
        tp = TopicPartition(self.topic, queue)
        with kafka_errors(f"reading the lag of queue {queue}"):
            try:
                async with self.probing(group) as consumer:
                    committed = await fetch_committed(consumer, tp)
                    if committed is None:
                        start = await self.new_group_offset(consumer, tp)
                        return max(0, await self.high_watermark(consumer, tp, start) - start)
                    log_start = int((await consumer.beginning_offsets([tp]))[tp])
                    high = await self.high_watermark(consumer, tp,
                                                     max(int(committed[0]), log_start))
            except TopicMissingError:
                return 0
        return kafka_offsets.unfinished(high, log_start, int(committed[0]), committed[1])
