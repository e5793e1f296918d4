"""The Kafka queue adapter: one topic, partition ``i`` is queue ``i``.

Producer side (here): every message goes to the partition the hash ring chose
(explicit partition), with key = stream key and Conveyor's metadata in headers
(:mod:`conveyor.adapters.kafka.codec`; "Wire format" in docs/kafka.md), so kcat or any
Kafka client can publish. Consumer side: one :class:`KafkaReceiver` per owned partition
(:mod:`conveyor.adapters.kafka.receiver`).

The adapter owns a :class:`KafkaCluster` (:mod:`conveyor.adapters.kafka.cluster`: the
connections and the topic) and hands it to the receivers, to its two facets — dead
letters (:mod:`~conveyor.adapters.kafka.letters`) and consumer groups
(:mod:`~conveyor.adapters.kafka.groups`) — and to the helpers behind rewinding
(:mod:`~conveyor.adapters.kafka.rewind`) and hand-off records
(:mod:`~conveyor.adapters.kafka.handoff`). Connections, error
translation and outage back-off live in :mod:`conveyor.adapters.kafka.connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kerrors

from conveyor.adapters.kafka import rewind as kafka_rewind
from conveyor.adapters.kafka.aiokafka_internals import (
    queued_batch,
    record_appender,
    record_size,
    seal,
    withdraw,
)
from conveyor.adapters.kafka.cluster import KafkaCluster, TopicMissingError, TopicRisk
from conveyor.adapters.kafka.codec import letter_from_record, message_headers
from conveyor.adapters.kafka.connection import CLIENT_ERRORS, broker_error, kafka_errors
from conveyor.adapters.kafka.groups import KafkaGroups
from conveyor.adapters.kafka.handoff import HandoffLog
from conveyor.adapters.kafka.letters import KafkaDeadLetters
from conveyor.adapters.kafka.receiver import KafkaReceiver
from conveyor.platform.adapter import QueueAdapter, QueueReceiver, StoreProblem, open_receivers
from conveyor.platform.config import Config, KafkaConfig
from conveyor.platform.deadlines import TaskDeadlines
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    MessageTooLargeError,
    PublishUncertain,
)
from conveyor.platform.ids import POSITION_MAX, SequenceToken
from conveyor.platform.message import CONTENT_JSON, H_ID, H_NAMESPACE, Message
from conveyor.platform.partial_publish import publish_failure

log = logging.getLogger("conveyor.kafka")

_FRAMING = 61 + 21
"""A record batch's header and aiokafka's bound on a record's own overhead: what its
size check (``estimate_size_in_bytes``) adds to the key, value and headers."""


KAFKA_OFFSET_MAX = 2**63 - 1
"""The largest Kafka offset: offsets are signed 64-bit numbers."""


_Sent = tuple[Sequence[Message], "asyncio.Future[Any]", Any]
"""A send :meth:`KafkaAdapter.enqueue` handed over: its messages, the future its
delivery comes on (``send_batch``'s shield, or ``send``'s own), and the batch it queued
(:func:`queued_batch`; None for ``send``'s, or if not found)."""


def _tokens(queue: int, offset: int, count: int) -> list[SequenceToken]:
    """The tokens of ``count`` records stored from ``offset`` on (a map over a repeat: no
    comprehension frame a token)."""
    return list(map(SequenceToken, repeat(queue, count), range(offset, offset + count)))


def _let_go(deliveries: Iterable[asyncio.Future[Any]]) -> None:
    """The deliveries of a call that no longer awaits them, as it was cancelled (or
    raised) between two sends or while awaiting them: the outcome of each is marked
    seen, now or once it comes. Else asyncio logs "Future exception was never retrieved"
    for each that fails with nobody waiting: all of them when a close drops what the
    producer holds (ShutdownError), a batch whose request timed out later on.

    The deliveries are ``send_batch``'s shields and their batches' own futures
    (:func:`queued_batch`): a shield the cancelled call was awaiting is cancelled with
    it and no longer reads its batch's future. None is cancelled here: a shield would
    then leave its batch's future unseen too. The call's own error (a cancellation's
    records may or may not be stored) is what reaches its caller."""
    for delivery in deliveries:
        if delivery.done():
            _seen(delivery)
        else:
            delivery.add_done_callback(_seen)


def _seen(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled():
        delivery.exception()


class KafkaAdapter(QueueAdapter):
    name = "kafka"
    coalesce_publishes = False  # the producer batches concurrent sends itself (linger_ms)
    token_max = (KAFKA_OFFSET_MAX, POSITION_MAX)  # the minor part of a token is not used

    def __init__(self, config: KafkaConfig, total_queues: int, *,
                 new_group_start: str = "earliest",
                 request_timeout_ms: int | None = None) -> None:
        """``request_timeout_ms``: how long each of its clients waits for the broker's
        answer to one request; None, aiokafka's 40 s (:func:`for_commands` gives less)."""
        self.cluster = cluster = KafkaCluster(config, total_queues,
                                              new_group_start=new_group_start,
                                              request_timeout_ms=request_timeout_ms)
        self.config = config
        self.topic = cluster.topic
        self.dlq_topic = cluster.dlq_topic
        self.total_queues = total_queues
        self._group_consumers: dict[str, AIOKafkaConsumer] = {}
        # Receivers handed out and not yet shut down (weakly: a dropped one stops counting).
        self._receivers: weakref.WeakSet[KafkaReceiver] = weakref.WeakSet()
        self.handoffs = HandoffLog(cluster)
        self.dead_letters: KafkaDeadLetters = KafkaDeadLetters(
            cluster,
            lambda record, app: letter_from_record(record, app, config.topic,
                                                   config.default_namespace),
            lambda queue, messages: self.enqueue(queue, messages))
        self.groups = KafkaGroups(cluster, self.handoffs)
        self._publishing = 0
        """enqueue calls under way."""
        self._quiet: asyncio.Event | None = None
        """Set when the last enqueue under way ends, once :meth:`close` waits for it."""
        self._retention_warned: set[str] = set()
        """The letter topics' finite retentions logged (:meth:`_warn_of_retention`)."""
        self._abandoned = False
        """An enqueue was cancelled (a timeout, Ctrl-C), or gave up waiting
        (``publish_timeout_ms``), while the producer may hold its records."""
        self._publish_timeout_s = config.publish_timeout_ms / 1000
        self._deadlines = TaskDeadlines(min(1.0, self._publish_timeout_s / 10))
        """The enqueues' deadlines (``publish_timeout_ms``), on one timer: a call fails
        at most a tenth of the timeout (at most 1 s) past it."""

    # -- the cluster, as callers of the adapter see it ---------------------------------
    @property
    def idempotent(self) -> bool:
        """Whether the producer is idempotent (known once it has started)."""
        return self.cluster.idempotent

    @property
    def topic_changed(self) -> BrokerError | None:
        """Set once the topic was deleted or re-created under this process (see
        :meth:`KafkaCluster.topic_gone`): no receiver reads or commits from then on."""
        return self.cluster.topic_changed

    async def producer(self) -> AIOKafkaProducer:
        return await self.cluster.producer()

    async def ensure_topic(self) -> None:
        """Create the topic with ``total_queues`` partitions if absent; check it if present."""
        await self.cluster.ensure_topic()

    def attach_group_consumer(self, group: str, consumer: AIOKafkaConsumer | None) -> None:
        """Receivers of ``group`` read and commit through this consumer (kafka-group)."""
        if consumer is None:
            self._group_consumers.pop(group, None)
        else:
            self._group_consumers[group] = consumer

    async def close(self) -> None:
        """Close the dead-letter reader and the cluster's clients once the enqueues under
        way have ended (each within ``publish_timeout_ms``: a producer stopped under
        them failed those whose records it did not hold yet with ``ProducerClosed``, a
        client's ``close()`` beside its publishes about half of them). The producer
        delivers what it holds first, except the records of enqueues that were
        cancelled: nobody waits for those, and against a broker that stopped answering
        the producer would wait out its request timeout (40 s) for them. They may or may
        not be stored, as for any cancelled call."""
        if self._publishing:
            self._quiet = asyncio.Event()
            await self._quiet.wait()
        if self._abandoned and not self._publishing:
            self.cluster.abandon_sends()
        with contextlib.suppress(Exception):
            await self.dead_letters.close()
        await self.cluster.close()

    # -- the broker's settings ---------------------------------------------------------
    async def check_server(self) -> None:
        """Refuse (:class:`ConfigError`) a dead-letter topic or its ops topic that the
        broker compacts (:meth:`KafkaCluster.compaction_loses`): a daemon's dead letters
        would be deleted, or its purges forgotten; warn of one with a finite retention
        (:meth:`KafkaCluster.retention_loses`), which an operator may mean. The queues'
        topic is checked as it is prepared; the hand-off and members topics are
        compacted by design."""
        risks = await self.cluster.letter_topic_risks()
        for risk in risks:
            if risk.kind == "compacted":
                raise ConfigError(risk.warning)
        self._warn_of_retention(risks)

    async def recheck_server(self) -> None:
        """A dead-letter topic compacted since the start, or partitions added to the
        queues' topic (or taken away) since: an error logged at every look, the daemon
        goes on (as :meth:`QueueAdapter.recheck_server` says); a retention set since,
        or changed, a warning, once."""
        risks = await self.cluster.letter_topic_risks()
        for risk in risks:
            if risk.kind == "compacted":
                log.error("%s", risk.warning)
        self._warn_of_retention(risks)
        with kafka_errors("reading the topic"):
            async with self.cluster.admin() as client:
                # A topic gone is the receivers' to say (KafkaCluster.topic_gone).
                found = self.topic in set(await client.list_topics())
                drift = await self.cluster.partition_drift(client) if found else None
        if drift is not None:  # records published past queues.total: read by no daemon
            log.error("%s (the topic changed under this running worker, which goes on "
                      "with the partitions it has; a worker started under this config "
                      "refuses the topic)", drift)

    def _warn_of_retention(self, risks: Sequence[TopicRisk]) -> None:
        """Log each finite retention of a letter topic once while it stays as it is (not
        at every recheck: it may be meant)."""
        found = {r.found + " " + r.topic: r.warning for r in risks if r.kind == "retention"}
        for key, warning in found.items():
            if key not in self._retention_warned:
                log.warning("%s", warning)
        self._retention_warned = set(found)

    async def store_problems(self, queues: Sequence[int], groups: Sequence[str], *,
                             every_app: bool = False) -> list[StoreProblem]:
        """The queues' topic where it does not exist (nothing else is looked at then), and
        the dead-letter topics the broker compacts or keeps for a finite time or size,
        where ``groups`` names any app or ``every_app`` (they are every app's, whether
        it has a group yet or not), and those whose settings it did not tell (reported
        here, not logged). The queues' topic compacted is refused when it is prepared,
        not reported."""
        if not groups and not every_app:
            return []
        try:
            await self.cluster.require_topic()
        except TopicMissingError as exc:  # a typo in [kafka] topic, most likely
            return [StoreProblem(self.topic, "the queues", "no such topic", str(exc))]
        holds = {self.cluster.dlq_topic: "every app's dead letters",
                 self.cluster.dlq_ops_topic: "what dlq replay and purge did"}
        return [StoreProblem(r.topic, holds[r.topic], r.found, r.warning)
                for r in await self.cluster.letter_topic_risks(quiet=True)]

    # -- producing ---------------------------------------------------------------------
    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        """Append in order: record batches built here (``create_batch``), one send each.

        A record over ``$.kafka.max_request_size`` refuses the call before anything is
        sent. The producer retries a send after a cut connection by itself; idempotent
        (see ``$.kafka.idempotence``), the broker writes a retried batch once. Each
        record batch is stored whole or not at all: when some were and others not (or
        may not have been), :class:`PartialPublishError` says which; when nothing is
        known stored and some may be, :class:`PublishUncertain`.

        The call waits at most ``$.kafka.publish_timeout_ms`` without the broker
        acknowledging one of its batches (the clock restarts at each; the producer
        start and the metadata wait count too): then it stops waiting
        (:meth:`_timed_out`), and says which batches were stored, which were never sent
        and which may yet be.
        """
        if not messages:
            return []
        self._publishing += 1
        sent: list[_Sent] = []  # handed over
        task = asyncio.current_task()
        assert task is not None  # a coroutine awaited runs in a task
        deadlines, cancelling = self._deadlines, task.cancelling()
        deadlines.set(task, self._publish_timeout_s)
        try:
            try:
                producer = await self.cluster.producer()  # unreachable: nothing was sent
                if len(messages) == 1:  # into the partition's open batch, with others
                    msg, what = messages[0], self._what(queue, messages)
                    delivery = await self._send_one(producer, what, queue, msg)
                    sent.append((messages, delivery, None))
                    try:
                        with kafka_errors(what):
                            return [SequenceToken(queue, (await delivery).offset)]
                    except BrokerConnectionError as exc:
                        raise PublishUncertain(
                            f"{exc}: the message may or may not have been written; its "
                            "id is in .message_ids", (msg.id,)) from exc
                return await self._enqueue(producer, queue, messages, sent, task)
            except asyncio.CancelledError:
                if not deadlines.expired(task, cancelling):
                    raise
            return self._timed_out(queue, messages, sent)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):  # its caller gone: what the
                self._abandoned = True  # producer holds of it is nobody's to wait for (close)
            _let_go([*(delivery for _, delivery, _ in sent),
                     *(batch.future for _, _, batch in sent if batch is not None)])
            raise
        finally:
            deadlines.clear(task)
            self._publishing -= 1
            if not self._publishing and self._quiet is not None:
                self._quiet.set()

    async def _enqueue(self, producer: AIOKafkaProducer, queue: int,
                       messages: Sequence[Message], sent: list[_Sent],
                       task: asyncio.Task[Any]) -> list[SequenceToken]:
        """:meth:`enqueue` of more than one message: record batches, each send handed
        over added to ``sent``; each batch's answer restarts the task's deadline."""
        batches = self._batches(producer, messages)  # all built, so none is sent if one
        unsent: BrokerError | None = None  # record is too big
        tp = TopicPartition(self.topic, queue)
        deadlines, timeout_s = self._deadlines, self._publish_timeout_s
        progress = None if len(batches) == 1 else (
            lambda _: deadlines.restart(task, timeout_s))
        try:
            with kafka_errors(self._what(queue, messages)):
                for msgs, builder in batches:
                    delivery = await producer.send_batch(builder, self.topic, partition=queue)
                    sent.append((msgs, delivery, queued_batch(producer, tp, builder)))
                    if progress is not None:
                        delivery.add_done_callback(progress)
        except BrokerError as exc:
            if not sent:  # failed before the first batch was handed over: none was sent
                raise
            unsent = exc
        if unsent is None and len(sent) == 1:  # the common call: one batch, no gather
            try:
                return _tokens(queue, (await sent[0][1]).offset, len(messages))
            except Exception as exc:  # as gather(return_exceptions=True) would hand it
                return self._stored(queue, messages, sent, [exc], None)
        results = await asyncio.gather(*(delivery for _, delivery, _ in sent),
                                       return_exceptions=True)
        if unsent is None:
            tokens: list[SequenceToken] = []
            for (msgs, _, _), meta in zip(sent, results, strict=True):
                if isinstance(meta, BaseException):
                    break
                tokens += _tokens(queue, meta.offset, len(msgs))
            else:
                return tokens
        return self._stored(queue, messages, sent, results, unsent)

    def _timed_out(self, queue: int, messages: Sequence[Message],
                   sent: list[_Sent]) -> list[SequenceToken]:
        """The outcome of a call whose clock ran out: the broker answered none of its
        batches for ``publish_timeout_ms``. Each batch handed over is

        - stored, or refused, if its answer came;
        - not sent, if the producer's sender never took it: it is taken back
          (:func:`withdraw`), so it never will be;
        - in doubt otherwise (a request carried it, or is carrying it: the producer
          keeps retrying it, and the broker may store it once it answers): and the
          records of a single message (``send``), which share their batch with other
          calls' and are not taken back.

        The batches never handed over were not sent. What the producer still holds of
        the call is nobody's to wait for, as a cancelled call's (:meth:`close`); the
        error raised from here goes through :meth:`enqueue`'s ``_let_go``."""
        self._abandoned = True
        what = self._what(queue, messages)
        silent = (f"kafka: {what} failed: no answer from the broker for "
                  f"{self._publish_timeout_s:g}s ($.kafka.publish_timeout_ms)")
        if not sent:
            raise BrokerConnectionError(f"{silent}; nothing was sent")
        producer = self.cluster.started_producer
        not_sent = BrokerConnectionError(f"{silent}; these were not sent")
        in_doubt = (f"{silent}: the messages may or may not have been written (the "
                    "producer sends them again until the broker answers or the client "
                    "closes); their ids are in .message_ids")
        results: list[Any] = []
        for msgs, delivery, batch in sent:
            answer = delivery if batch is None else batch.future
            if answer.done() and not answer.cancelled():
                results.append(answer.exception() or answer.result())
            elif batch is not None and producer is not None and withdraw(producer, batch,
                                                                         not_sent):
                results.append(not_sent)
            else:
                results.append(PublishUncertain(in_doubt, tuple(m.id for m in msgs)))
        handed = sum(len(msgs) for msgs, _, _ in sent)
        return self._stored(queue, messages, sent, results,
                            not_sent if handed < len(messages) else None)

    @staticmethod
    def _what(queue: int, messages: Sequence[Message]) -> str:
        return f"publishing {len(messages)} messages to queue {queue}"

    def _batches(self, producer: AIOKafkaProducer, messages: Sequence[Message]
                 ) -> list[tuple[Sequence[Message], Any]]:
        """``messages`` as sealed record batches (with the messages each holds); a record
        over ``$.kafka.max_request_size`` refuses them all (aiokafka's ``send`` would
        refuse it; ``send_batch`` does not check).

        Records go straight into each batch's record builder (:func:`record_appender`);
        each batch is sealed, so the producer sends it without waiting ``linger_ms``."""
        near = self.config.max_request_size - _FRAMING  # a record this big is checked
        batches: list[tuple[Sequence[Message], Any]] = []
        start, count, batch = 0, 0, producer.create_batch()  # count: records in batch
        append = record_appender(batch)
        namespace, common = "", [(H_NAMESPACE, b""), (H_ID, b"")]
        for msg in messages:
            stream = msg.stream
            user = msg.headers
            if msg.attempt or msg.content_type != CONTENT_JSON or len(user) > 1:
                headers = message_headers(msg)
            else:
                # message_headers(msg) of the common message, without the call: cv-ns
                # (encoded once a namespace), cv-id, and its one user header if it has
                # one (a traceparent, tracing on). The builder copies the list's bytes
                # as it appends, so one list serves every such record.
                if stream.namespace != namespace:
                    namespace = stream.namespace
                    common[0] = (H_NAMESPACE, namespace.encode())
                common[1] = (H_ID, msg.id.encode())
                headers = common
                if user:
                    [(name, value)] = user.items()
                    headers = [common[0], common[1], (name, value.encode())]
            key, ts, body = stream.key.encode(), msg.enqueued_at_ms or None, msg.body
            meta = append(count, ts, key, body, headers)  # ts: no cv-ts (see codec)
            if meta is None:  # full: start the next (a batch always takes its first record)
                seal(batch, count)
                batches.append((messages[start:start + count], batch))
                start, count, batch = start + count, 0, producer.create_batch()
                append = record_appender(batch)
                meta = append(0, ts, key, body, headers)
            count += 1
            if meta.size > near:  # near the limit: count as aiokafka's send() counts
                size = record_size(key, body, headers)
                if size > self.config.max_request_size:
                    raise self._too_large(msg, size)
        seal(batch, count)
        batches.append((messages[start:], batch))
        return batches

    def _too_large(self, msg: Message, size: int) -> MessageTooLargeError:
        return MessageTooLargeError(
            f"kafka: message {msg.id} to stream {msg.stream.shown()} "
            f"is {size} bytes as a record, larger than $.kafka.max_request_size "
            f"({self.config.max_request_size}); nothing was sent: raise it together with "
            "the broker's message.max.bytes, or send less")

    def _stored(self, queue: int, messages: Sequence[Message], sent: list[_Sent],
                results: list[Any], unsent: BrokerError | None) -> list[SequenceToken]:
        """The tokens of a send some of whose batches failed, or were not handed over:
        the error saying which batches failed (or, when none did in the end, the
        tokens). A result that is already Conveyor's error (:meth:`_timed_out`'s) is
        taken as it is."""
        what = self._what(queue, messages)
        tokens: list[SequenceToken] = []
        published: dict[str, SequenceToken] = {}
        failures: list[tuple[list[str], BaseException]] = []
        for (msgs, _, _), meta in zip(sent, results, strict=True):
            if isinstance(meta, BrokerError):
                failures.append(([m.id for m in msgs], meta))
                continue
            if isinstance(meta, BaseException):
                if not isinstance(meta, CLIENT_ERRORS):
                    raise meta
                error = broker_error(what, meta)
                if isinstance(error, BrokerConnectionError):
                    error = PublishUncertain(
                        f"{error}: the messages may or may not have been written; their "
                        "ids are in .message_ids", tuple(m.id for m in msgs))
                failures.append(([m.id for m in msgs], error))
                continue
            batch_tokens = _tokens(queue, meta.offset, len(msgs))
            published.update(zip((m.id for m in msgs), batch_tokens, strict=True))
            tokens += batch_tokens
        if unsent is not None:
            handed = sum(len(msgs) for msgs, _, _ in sent)
            failures.append(([m.id for m in messages[handed:]], unsent))
        if failures:
            raise publish_failure(f"kafka: {what}", [m.id for m in messages], published,
                                  failures)
        return tokens

    async def _send_one(self, producer: AIOKafkaProducer, what: str, queue: int,
                        msg: Message) -> asyncio.Future[Any]:
        """One record through ``send``: the producer appends it to the partition's open
        batch, so concurrent single publishes share a request (Client.publish). Returns
        the future its delivery comes on."""
        headers = message_headers(msg)
        try:
            with kafka_errors(what):
                delivery: asyncio.Future[Any] = await producer.send(
                    self.topic, msg.body, key=msg.stream.key.encode(), partition=queue,
                    headers=headers, timestamp_ms=msg.enqueued_at_ms or None,
                )
                return delivery
        except BrokerError as exc:  # aiokafka checks the size before sending
            if not isinstance(exc.__cause__, kerrors.MessageSizeTooLargeError):
                raise
            raise self._too_large(msg, record_size(msg.stream.key.encode(), msg.body,
                                                   headers)) from None

    # -- consuming ---------------------------------------------------------------------
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = KafkaReceiver(self.cluster, self.handoffs, queue, group,
                                 self._group_consumers.get(group))
        self._receivers.add(receiver)
        return receiver

    async def lag(self, queue: int, group: str) -> int:
        return await self.cluster.lag(queue, group)

    async def rewind(self, queue: int, group: str, to: SequenceToken | float) -> None:
        await kafka_rewind.rewind(self.cluster, self.handoffs, queue, group, to)

    def check_time(self, when: float) -> None:
        kafka_rewind.check_time(when)

    async def forward_gap(self, queue: int, group: str, to: SequenceToken | float) -> int:
        return await kafka_rewind.forward_gap(self.cluster, queue, group, to)

    async def owners(self, queues: Sequence[int], group: str) -> dict[int, str]:
        """This adapter's open receivers, then the group's members that the broker says
        hold the queues (see :func:`conveyor.adapters.kafka.rewind.owners`)."""
        return {**open_receivers(self._receivers, queues, group),
                **await kafka_rewind.owners(self.cluster, queues, group)}


def from_config(config: Config) -> KafkaAdapter:
    return KafkaAdapter(config.kafka, config.queues.total,
                        new_group_start=config.queues.new_group_start)


def for_commands(config: Config) -> KafkaAdapter:
    """The adapter of an operator's command: each request waits at most ``[kafka]
    command_timeout_ms`` for the broker's answer, so a broker that accepts connections
    and never answers fails the command in that long, not in aiokafka's 40 s."""
    return KafkaAdapter(config.kafka, config.queues.total,
                        new_group_start=config.queues.new_group_start,
                        request_timeout_ms=config.kafka.command_timeout_ms)
