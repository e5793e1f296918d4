"""Dead letters on Kafka (the adapter's ``dead_letters`` facet): store, list, find,
count, purge and replay them.

Letters are records of ``<topic>.conveyor-dlq`` (partition 0, every app's, see
:mod:`conveyor.platform.letters`); a letter's id is ``PARTITION:OFFSET`` there. Kafka
cannot delete one record, so what is done to letters is written down beside them, in
``<topic>.conveyor-dlq-ops`` (partition 0, key = app, value JSON, kept forever)::

    {"op": "replaying", "ids": ["0:41"], "queue": 3, "from_offset": 1200, "run": "9f…",
     "at_ms": 1764330000000, "by": "host|boot|pid:[…]/4242/81234", "over": "", "v": 2}
    {"op": "replayed",  "ids": ["0:41"]}
    {"op": "purged",    "ids": ["0:42", "0:43"], "run": "77a…"}
    {"op": "stopped",   "ids": [], "run": "9f…"}

A letter named by a ``replayed`` or ``purged`` record is removed: it is listed, counted
and replayed no more (``kcat`` still shows it in the dead-letter topic).

Replay, without transactions (tansu has none), a batch at a time: (1) ``replaying``
claims the batch's letters, naming their queue and its end offset *before* the publish
(one record per queue, with the replay's ``run`` id, ``at_ms`` and ``by``, its process's
name, :mod:`conveyor.platform.processes`), and the ops topic is read back: a letter is the
replay's only if the claim that holds it there is its own (the first, see :class:`_Ops`),
so two replays at once publish each letter once; (2) the messages are published with
``cv-replay-of`` = their letter's id and the publish confirmed; (3) ``replayed`` names
them all. A replay that fails between (1) and (3) says so (``stopped``); one killed
leaves its ``replaying`` records alone. Running it again first looks for those letters'
messages in their queues from ``from_offset`` on (by ``cv-replay-of``): found, it only
writes (3) for them; not found, it publishes. So each letter is published once, killed
at any point.

Another replay waits for a claim's replay to end, and takes its letters over (a claim
naming the run it takes ``over``; the first to name it wins) only once that replay has
stopped: once it said so; on the same machine, once its process is gone (at once, however
long it had run; never while it runs, however slow); from elsewhere, once the claim is
older than :data:`CLAIM_TTL_S` (a replay reaches its publish at most
:data:`CLAIM_PUBLISH_S` after its claim, or gives the batch up).

The window that remains is between machines: a batch whose publish alone takes longer
than :data:`CLAIM_TTL_S` minus :data:`CLAIM_PUBLISH_S` while a replay on another machine
takes it over (the slow replay then warns that its letters may have been published
twice), or operators' clocks that far apart; and anywhere, a publish request the broker
had received but not yet appended when a re-run scanned the queue, or an ops topic
someone deleted by hand. Claims written before ``by`` and ``over`` existed (no ``v``) go
by age alone, as they did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kerrors

from conveyor.adapters.kafka.aiokafka_internals import raw_records
from conveyor.adapters.kafka.cluster import QUICK_FETCH_MS, KafkaCluster
from conveyor.adapters.kafka.codec import letter_record
from conveyor.adapters.kafka.connection import broker_error, kafka_errors, start_client
from conveyor.platform.adapter import DeadLetters
from conveyor.platform.errors import BrokerConnectionError, InvalidArgumentError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import H_REPLAY_OF, DeadLetter, Message, now_ms
from conveyor.platform.operations.dlq import checkpoint
from conveyor.platform.processes import Seen, seen, this_process
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

ReadLetter = Callable[[Any, str], DeadLetter | None]
"""(record, app) -> the app's letter in that record, or None (the adapter's decoder)."""
Publish = Callable[[int, Sequence[Message]], Awaitable[list[SequenceToken]]]
"""(queue, messages) -> their tokens: the adapter's enqueue, which replays publish with."""

_LETTER_ID = re.compile(r"([0-9]{1,9}):([0-9]{1,19})")
_BATCH = 500
_STALL_S = 10.0  # no record within this long below the high watermark: give up


CLAIM_TTL_S = 15.0
"""How long a ``replaying`` record keeps its letters to the replay that wrote it, for a
replay on another machine: that one waits so long for them (they are usually replayed
within milliseconds) and only then takes them over, as those of a replay that was
stopped; a replay that reaches its publish later than :data:`CLAIM_PUBLISH_S` after its
claim gives the batch up instead. (On the writer's machine, its process is looked at.)"""
CLAIM_PUBLISH_S = 5.0
"""A replay publishes a claimed batch only this soon after claiming it (see
:data:`CLAIM_TTL_S`)."""
_CLAIM_POLL_S = 0.25
OP_IDS_MAX = 10_000
"""Letter ids per record of the ops topic (about 120 KB): an operation on more letters is
written as several records, each under the broker's default 1 MB limit (a purge of
120,000 letters in one record was refused, and nothing was purged)."""


class LetterOp(msgspec.Struct, frozen=True, omit_defaults=True):
    """One record of the ops topic (see the module docstring)."""

    op: str
    ids: list[str]
    queue: int = -1
    from_offset: int = -1
    run: str = ""
    """``replaying``: the replay that wrote it (a random id per replay call); ``purged``:
    the purge call that wrote it."""
    at_ms: int = 0
    """``replaying``: when, by the writer's clock (0: before claims had times)."""
    by: str = ""
    """``replaying``: the writer's process (:func:`~conveyor.platform.processes.this_process`)."""
    over: str = ""
    """``replaying``: the run whose letters this claim takes over (it had stopped)."""
    v: int = 1
    """2: a claim displaces another only by naming it in ``over``; 1: by being
    :data:`CLAIM_TTL_S` younger (claims written before ``over``)."""


@dataclass(frozen=True)
class _Claim:
    """A letter's replay in progress: its queue, the queue's end before the publish, who
    claimed it and when."""

    queue: int
    from_offset: int
    run: str
    at_ms: int
    by: str = ""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(LetterOp).decode


@dataclass
class _Ops:
    """One app's ops read so far: the ops topic up to ``position``."""

    position: int = 0
    removed: set[str] = field(default_factory=set)
    replaying: dict[str, _Claim] = field(default_factory=dict)
    """Letters whose replay started and did not finish, by the claim that holds them: the
    first in the topic, unless a later one takes it over (:func:`_displaces`). Every
    replay reads the same topic in the same order, so all agree on which claim holds a
    letter."""
    stopped: set[str] = field(default_factory=set)
    """Runs that wrote ``stopped``: they failed, and publish no more."""
    counting: dict[str, int] = field(default_factory=dict)
    """This process's purges under way, by run: the letters their records removed first
    (a letter another purge, or a replay, had removed is not theirs to count)."""

    def apply(self, op: LetterOp) -> None:
        if op.op == "replaying":
            claim = _Claim(op.queue, op.from_offset, op.run, op.at_ms, op.by)
            for letter_id in op.ids:
                held = self.replaying.get(letter_id)
                if held is None or _displaces(op, held):
                    self.replaying[letter_id] = claim
        elif op.op == "stopped":
            self.stopped.add(op.run)
        elif op.op in ("replayed", "purged"):
            if op.run in self.counting:
                self.counting[op.run] += len(set(op.ids) - self.removed)
            self.removed.update(op.ids)
            for letter_id in op.ids:
                self.replaying.pop(letter_id, None)


def _displaces(op: LetterOp, held: _Claim) -> bool:
    """Whether claim ``op`` takes a letter over from the claim that holds it: by naming
    its run (written by a replay that found it stopped: the first to name it wins, since
    the letter's claim is then another), or, a claim written before ``over`` existed, by
    being :data:`CLAIM_TTL_S` younger."""
    if op.v >= 2:
        return op.over == held.run
    return op.at_ms - held.at_ms >= CLAIM_TTL_S * 1000


_RUNNING: set[str] = set()
"""The runs of this process's replays between their claim and their end."""


def _has_stopped(claim: _Claim, watched_s: float, ops: _Ops) -> bool:
    """Whether the replay that wrote ``claim`` has stopped, as far as this process can
    tell: it said so (``stopped``); it ran in this process, or on this machine in a
    process that is gone; elsewhere, its claim is older than :data:`CLAIM_TTL_S` by the
    writer's clock, or has been watched here for twice that (clocks apart)."""
    if claim.run in ops.stopped:
        return True
    if claim.by and claim.by == this_process():
        return claim.run not in _RUNNING
    where = seen(claim.by)
    if where is not Seen.ELSEWHERE:
        return where is Seen.GONE
    return (claim.at_ms <= now_ms() - CLAIM_TTL_S * 1000
            or watched_s >= 2 * CLAIM_TTL_S)


def parse_id(letter_id: str) -> tuple[int, int]:
    match = _LETTER_ID.fullmatch(letter_id)
    if match is None:
        raise InvalidArgumentError(
            f"not a dead-letter id on kafka: {letter_id!r} (expected PARTITION:OFFSET of "
            "the dead-letter topic, e.g. 0:41)"
        )
    return int(match[1]), int(match[2])


class KafkaDeadLetters(DeadLetters):
    """One topic's dead letters: written by the cluster's producer, read by a consumer
    of their own."""

    def __init__(self, cluster: KafkaCluster, read_letter: ReadLetter,
                 publish: Publish) -> None:
        self.cluster = cluster
        self._read_letter = read_letter
        self._publish = publish
        self.ops_topic = cluster.dlq_ops_topic
        self._ops: dict[str, _Ops] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._ops_ready = False
        self._existing: set[str] = set()
        self._dlq_ready = False
        self._skipped_log = ThrottledLog(log, interval_s=3600.0)

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            with kafka_errors("closing the dead-letter reader"):
                await consumer.stop()

    # -- reading -------------------------------------------------------------------------
    async def _reader(self) -> AIOKafkaConsumer:
        """The consumer that reads the letters, the ops and replayed messages back: its
        records come as the batch holds them (``offset``, ``key``, ``value``,
        ``headers``, no topic or partition), and a record whose header names are not
        UTF-8 — which aiokafka's parser fails on, every fetch — as an
        :class:`~conveyor.adapters.kafka.aiokafka_internals.UnreadableRecord`, the
        batch's others as usual (:func:`~conveyor.adapters.kafka.aiokafka_internals.raw_records`,
        as a receiver reads its queue). Its fetches are answered at once
        (:data:`~conveyor.adapters.kafka.cluster.QUICK_FETCH_MS`), and its partition is
        fetched only while it is read (from :meth:`_on` to :meth:`_rest`, at the end of
        :meth:`_high`, of :meth:`_records` or where its caller stops early): a reader
        kept between readings does not poll the broker."""
        if self._consumer is None:
            consumer = self.cluster.new_consumer(None, fetch_max_wait_ms=QUICK_FETCH_MS,
                                                 **raw_records())
            await start_client(consumer, "connecting a dead-letter reader")
            self._consumer = consumer
        return self._consumer

    async def _exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (once it does, it is not asked again: Conveyor never
        deletes these topics)."""
        if topic in self._existing:
            return True
        with kafka_errors("reading the topics"):
            if topic in await (await self._reader()).topics():
                self._existing.add(topic)
                return True
        return False

    async def _on(self, tp: TopicPartition) -> AIOKafkaConsumer:
        """The reader, assigned ``tp`` alone. Assigned again only when it reads another
        partition: aiokafka's fetcher, stopped while it takes in a new assignment, can
        swallow the stop and fetch on for good (``consumer.stop()`` never returns), and
        a re-assignment followed by no read — a range of no records, an empty topic —
        then a close, hit that every other time."""
        consumer = await self._reader()
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        consumer.resume(tp)
        return consumer

    def _rest(self) -> None:
        """Stop fetching until the next read (:meth:`_on`)."""
        if self._consumer is not None:
            self._consumer.pause(*self._consumer.assignment())

    async def _high(self, tp: TopicPartition) -> int:
        try:
            with kafka_errors(f"reading the end of {tp.topic}"):
                consumer = await self._on(tp)
                return await self.cluster.high_watermark(consumer, tp, 0)
        finally:
            self._rest()

    async def _records(self, tp: TopicPartition, start: int, end: int) -> AsyncIterator[list[Any]]:
        """Batches of the records of ``tp`` from ``start`` up to ``end`` (exclusive)."""
        if start >= end:
            return
        loop = asyncio.get_running_loop()
        with kafka_errors(f"reading {tp.topic}"):
            consumer = await self._on(tp)
            consumer.seek(tp, start)
            position, stalled_at = start, loop.time()
            while position < end:
                records = (await consumer.getmany(tp, timeout_ms=500, max_records=_BATCH)
                           ).get(tp, [])
                if records:
                    position, stalled_at = records[-1].offset + 1, loop.time()
                    yield [r for r in records if r.offset < end]
                elif await consumer.position(tp) >= end:  # the rest were not records
                    break
                elif loop.time() - stalled_at > _STALL_S:
                    self._rest()
                    raise BrokerConnectionError(
                        f"kafka: no records of {tp.topic} from offset {position} in "
                        f"{_STALL_S:.0f}s (end {end})"
                    )
        # Not in a finally: a caller that stops early leaves the generator to be closed
        # later, in the middle of another read; it calls _rest itself.
        self._rest()

    async def ops(self, group: str) -> _Ops:
        """``group``'s ops, brought up to date with the ops topic."""
        state = self._ops.setdefault(group, _Ops())
        if not await self._exists(self.ops_topic):
            return state
        tp = TopicPartition(self.ops_topic, 0)
        high = await self._high(tp)
        key = group.encode()
        async for batch in self._records(tp, state.position, high):
            for record in batch:
                if record.key == key and record.value:
                    state.apply(_decode(record.value))
        state.position = max(state.position, high)
        return state

    async def _write(self, group: str, op: LetterOp) -> None:
        cluster = self.cluster
        if not self._ops_ready:
            await cluster.create_topics({self.ops_topic: 1}, {"retention.ms": "-1"})
            self._ops_ready = True
        producer = await cluster.producer(self.ops_topic)
        with kafka_errors("recording a dead-letter operation"):
            for start in range(0, len(op.ids), OP_IDS_MAX):
                chunk = msgspec.structs.replace(op, ids=op.ids[start : start + OP_IDS_MAX])
                await producer.send_and_wait(self.ops_topic, _encode(chunk),
                                             key=group.encode(), partition=0)

    def _letter(self, partition: int, record: Any, group: str) -> StoredLetter | None:
        """``group``'s letter in ``record``, or None: another app's, or no letter at all
        (another tool's record, as :meth:`page` skips) — or one that cannot be read back
        (corrupt: a ``cv-dl-token`` that is no token, a 0.1 JSON letter keyed by the app
        that is no JSON), skipped and said once per app and adapter rather than raised:
        one such record made every listing of every app fail."""
        try:
            letter = self._read_letter(record, group)
        except Exception:  # anyone's bytes: whatever they break is "no letter"
            self._skipped_log.log(
                logging.WARNING, group,
                "kafka: record %d:%d of %s is no dead letter of %s that can be read back "
                "(corrupt: it claims to be one): dlq commands skip it (`kcat -C -t %s -p "
                "%d -o %d -c 1` shows it)", partition, record.offset, self.cluster.dlq_topic,
                group, self.cluster.dlq_topic, partition, record.offset)
            return None
        return None if letter is None else StoredLetter(f"{partition}:{record.offset}",
                                                        letter)

    # -- the port --------------------------------------------------------------------------
    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """One record per letter on partition 0 of ``<topic>.conveyor-dlq`` (see
        conveyor.platform.letters), created with ``retention.ms = -1``: no bound here,
        the topic's retention is the broker's business (0 evicted, always)."""
        if not self._dlq_ready:
            await self.cluster.producer()  # the app's topic first
            await self.cluster.create_topics({self.cluster.dlq_topic: 1}, {"retention.ms": "-1"})
            self._dlq_ready = True
        producer = await self.cluster.producer(self.cluster.dlq_topic)
        try:
            futures = [
                await producer.send(self.cluster.dlq_topic, value, key=key, partition=0,
                                    headers=headers)
                for key, value, headers in (letter_record(letter, group) for letter in letters)
            ]
            await asyncio.gather(*futures)
        except (kerrors.KafkaError, OSError) as exc:
            raise broker_error("writing dead letters", exc) from exc
        return 0

    async def page(self, group: str, limit: int = 100, *, after: str | None = None,
                   until: str | None = None) -> list[StoredLetter]:
        """The app's records by offset, from just after ``after``'s (stored or not),
        read on until ``limit`` letters are found or ``until`` (the topic's end) is
        reached: records of other apps, and records that are no letters, are skipped
        however many come first (not held: a batch of records at a time is)."""
        start = 0
        if after is not None:
            _, offset = parse_id(after)
            start = offset + 1
        last = None if until is None else parse_id(until)[1]
        out: list[StoredLetter] = []
        if limit <= 0 or not await self._exists(self.cluster.dlq_topic):
            return out
        removed = (await self.ops(group)).removed
        tp = TopicPartition(self.cluster.dlq_topic, 0)
        end = await self._high(tp)
        if last is not None:
            end = min(end, last + 1)
        async for batch in self._records(tp, start, end):
            for record in batch:
                stored = self._letter(0, record, group)
                if stored is not None and stored.id not in removed:
                    out.append(stored)
                    if len(out) >= limit:
                        self._rest()
                        return out
        return out

    def check_id(self, letter_id: str) -> None:
        parse_id(letter_id)

    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        partition, offset = parse_id(letter_id)
        if not await self._exists(self.cluster.dlq_topic):
            return None
        if letter_id in (await self.ops(group)).removed:
            return None
        tp = TopicPartition(self.cluster.dlq_topic, partition)
        if partition != 0 or offset >= await self._high(tp):
            return None
        async for batch in self._records(tp, offset, offset + 1):
            for record in batch:
                if record.offset == offset:
                    self._rest()
                    return self._letter(partition, record, group)
        return None

    async def mark(self, group: str) -> str | None:
        """The dead-letter topic's last offset (perhaps another app's record: a bound,
        which is all :meth:`page` needs); every later letter is appended after it."""
        if not await self._exists(self.cluster.dlq_topic):
            return None
        high = await self._high(TopicPartition(self.cluster.dlq_topic, 0))
        return f"0:{high - 1}" if high > 0 else None

    async def count(self, group: str) -> int:
        """Counted record by record: no letter is kept (a million letters of 10 KB
        were 10 GB read into a list)."""
        if not await self._exists(self.cluster.dlq_topic):
            return 0
        removed = (await self.ops(group)).removed
        tp = TopicPartition(self.cluster.dlq_topic, 0)
        found = 0
        async for batch in self._records(tp, 0, await self._high(tp)):
            for record in batch:
                stored = self._letter(0, record, group)
                if stored is not None and stored.id not in removed:  # as page() keeps
                    found += 1
        return found

    async def delete(self, group: str, ids: Sequence[str]) -> int:
        """Recorded as purged in ``<topic>.conveyor-dlq-ops``: Kafka keeps the records.
        Only the range of ``ids`` is read (``purge --all`` deletes a page at a time).
        Counted: the letters this call's records removed first (two purges at once count
        each letter once)."""
        for letter_id in ids:
            parse_id(letter_id)
        state = await self.ops(group)
        stored = await self._stored_ids(group, list(ids), state.removed)
        gone = sorted(stored, key=parse_id)
        if not gone:
            return 0
        # Another purge may record the same letters meanwhile: each counts those its
        # records removed first, read back in the order every reader applies them.
        run = uuid.uuid4().hex
        state.counting[run] = 0
        try:
            await self._write(group, LetterOp("purged", gone, run=run))
            await self.ops(group)
            return state.counting[run]
        finally:
            del state.counting[run]

    async def replay(self, group: str, replays: Sequence[Replay]
                     ) -> list[SequenceToken | None]:
        """Claimed in ``<topic>.conveyor-dlq-ops`` before the publish and recorded after
        it, so a re-run finds a publish that was not recorded and two replays at once
        publish each letter once: see the module docstring (claim, publish, replayed —
        per batch)."""
        for replay in replays:
            parse_id(replay.letter_id)
        state = await self.ops(group)
        stored = await self._stored_ids(group, [r.letter_id for r in replays], state.removed)
        state = await self._settled(group, stored)
        wanted = [r for r in replays if r.letter_id in stored
                  and r.letter_id not in state.removed]
        stopped = {r.letter_id: state.replaying[r.letter_id] for r in wanted
                   if r.letter_id in state.replaying}
        run, claimed_at = uuid.uuid4().hex, time.monotonic()
        _RUNNING.add(run)
        try:
            await self._claim(group, run, wanted, stopped)
            tokens = await self._publish_claimed(group, run, claimed_at, wanted, stopped)
        except BaseException:
            with contextlib.suppress(Exception):  # else taken over once this process ends
                await self._write(group, LetterOp("stopped", [], run=run))
            raise
        finally:
            _RUNNING.discard(run)
        return [tokens.get(r.letter_id) for r in replays]

    async def _publish_claimed(self, group: str, run: str, claimed_at: float,
                               wanted: Sequence[Replay], stopped: dict[str, _Claim]
                               ) -> dict[str, SequenceToken]:
        """Steps (2) and (3) for the letters of ``wanted`` whose claim is ``run``'s."""
        state = await self.ops(group)
        mine = [r for r in wanted if r.letter_id not in state.removed
                and getattr(state.replaying.get(r.letter_id), "run", None) == run]
        tokens: dict[str, SequenceToken] = {}
        taken = {r.letter_id: stopped[r.letter_id] for r in mine if r.letter_id in stopped}
        if taken:  # a stopped replay's: what it published is not published again
            tokens.update(await self._published(taken))
        by_queue: dict[int, list[Replay]] = {}
        for replay in mine:
            if replay.letter_id not in tokens:
                by_queue.setdefault(replay.queue, []).append(replay)
        late = time.monotonic() - claimed_at
        if by_queue and late > CLAIM_PUBLISH_S:
            raise BrokerConnectionError(
                f"kafka: claiming {len(mine)} dead letter(s) took {late:.1f}s (over "
                f"{CLAIM_PUBLISH_S:.0f}s): not published, so that no other replay can "
                f"publish them too; run the replay again")
        published = await asyncio.gather(*(
            self._publish(queue, [r.message for r in batch])
            for queue, batch in by_queue.items()
        ))
        for batch, queue_tokens in zip(by_queue.values(), published, strict=True):
            tokens.update((r.letter_id, t) for r, t in zip(batch, queue_tokens, strict=True))
        checkpoint("published")
        if by_queue and time.monotonic() - claimed_at > CLAIM_TTL_S:
            await self._check_not_taken(
                group, run, [r.letter_id for batch in by_queue.values() for r in batch],
                claimed_at)
        if tokens:
            await self._write(group, LetterOp("replayed", sorted(tokens, key=parse_id)))
        return tokens

    async def _settled(self, group: str, ids: set[str]) -> _Ops:
        """``group``'s ops once no other replay that still runs holds any of ``ids``:
        each is replayed, purged, unclaimed, or its claim's replay has stopped
        (:func:`_has_stopped`: to take over). While a replay on this machine holds them,
        this waits for it to end, saying so once after :data:`CLAIM_TTL_S`."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        watched: dict[str, float] = {}
        said = False
        while True:
            state = await self.ops(group)
            now = loop.time()
            holders = {state.replaying[i].run: state.replaying[i] for i in ids
                       if i not in state.removed and i in state.replaying}
            running = [claim for run, claim in holders.items()
                       if not _has_stopped(claim, now - watched.setdefault(run, now), state)]
            if not running:
                return state
            if not said and now - started > CLAIM_TTL_S:
                said = True
                pids = sorted({c.by.rsplit("/", 2)[-2] for c in running
                               if seen(c.by) is Seen.RUNNING})
                log.warning("kafka: dead letters of %s are held by another replay that is "
                            "still running%s; waiting for it to end", group,
                            f" (pid {', '.join(pids)} on this machine)" if pids else "")
            await asyncio.sleep(_CLAIM_POLL_S)

    async def _claim(self, group: str, run: str, wanted: Sequence[Replay],
                     stopped: dict[str, _Claim]) -> None:
        """One ``replaying`` record per queue (and per stopped replay taken over) for
        ``wanted``: from the queue's end, or a stopped replay's letters from where it
        claimed them (a later takeover must scan from there), naming the run taken over."""
        claims: dict[tuple[int, int, str], list[str]] = {}
        ends: dict[int, int] = {}
        for replay in wanted:
            held = stopped.get(replay.letter_id)
            if held is not None and held.queue == replay.queue:
                start = held.from_offset
            else:
                if replay.queue not in ends:
                    ends[replay.queue] = await self._high(
                        TopicPartition(self.cluster.topic, replay.queue))
                start = ends[replay.queue]
            over = held.run if held is not None else ""
            claims.setdefault((replay.queue, start, over), []).append(replay.letter_id)
        at_ms, by = now_ms(), this_process()
        for (queue, start, over), ids in claims.items():
            await self._write(group, LetterOp("replaying", ids, queue, start, run, at_ms,
                                              by, over, v=2))

    async def _check_not_taken(self, group: str, run: str, ids: list[str],
                               claimed_at: float) -> None:
        """Warn when a replay elsewhere took over letters this one published after
        :data:`CLAIM_TTL_S` (the window the module docstring names): both may have
        published them."""
        state = await self.ops(group)
        taken = [i for i in ids if i in state.removed
                 or getattr(state.replaying.get(i), "run", run) != run]
        if taken:
            log.warning("kafka: publishing %d replayed dead letter(s) of %s took %.0fs, "
                        "and another replay took them over meanwhile: they may have been "
                        "published twice (%s)", len(taken), group,
                        time.monotonic() - claimed_at, ", ".join(sorted(taken, key=parse_id)[:5]))

    async def _stored_ids(self, group: str, ids: list[str], removed: set[str]) -> set[str]:
        """Which of ``ids`` are letters of ``group`` still stored (one read of their range)."""
        wanted = {i for i in ids if i not in removed and parse_id(i)[0] == 0}
        if not wanted or not await self._exists(self.cluster.dlq_topic):
            return set()
        tp = TopicPartition(self.cluster.dlq_topic, 0)
        offsets = [parse_id(i)[1] for i in wanted]
        end = min(max(offsets) + 1, await self._high(tp))
        found: set[str] = set()
        async for batch in self._records(tp, min(offsets), end):
            for record in batch:
                letter_id = f"0:{record.offset}"
                if letter_id in wanted and self._letter(0, record, group) is not None:
                    found.add(letter_id)
        return found

    async def _published(self, started: dict[str, _Claim]) -> dict[str, SequenceToken]:
        """Where messages replayed from these letters (by their stopped claims) already
        sit in their queues, for those that do (found by their ``cv-replay-of``)."""
        found: dict[str, SequenceToken] = {}
        queues: dict[int, int] = {}
        for claim in started.values():
            queue, from_offset = claim.queue, claim.from_offset
            queues[queue] = min(from_offset, queues.get(queue, from_offset))
        for queue, from_offset in queues.items():
            tp = TopicPartition(self.cluster.topic, queue)
            async for batch in self._records(tp, from_offset, await self._high(tp)):
                for record in batch:
                    for name, value in record.headers:
                        letter_id = value.decode() if name == H_REPLAY_OF and value else ""
                        held = started.get(letter_id)
                        if held is not None and held.queue == queue:
                            found.setdefault(letter_id, SequenceToken(queue, record.offset))
        return found
