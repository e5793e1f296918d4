"""The ops topic of Kafka's dead letters (conveyor/adapters/kafka/letters.py): a replay
that reaches its publish too late after its claim publishes nothing and says it stopped,
and the next replay takes its claim over at once; a claim whose process still runs on
this machine is waited for however old it is, and taken over once that process ends —
each letter published once, none lost; an operation on many letters is written in
records the broker takes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka import letters as kafka_letters
from conveyor.platform.config import load_config
from conveyor.platform.errors import BrokerConnectionError
from conveyor.platform.ids import StreamId
from conveyor.platform.letters import StoredLetter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import H_REPLAY_OF, DeadLetter, Message, now_ms
from conveyor.platform.operations import dlq
from conveyor.platform.processes import name_of
from tests.integration.kafka.conftest import Tansu

pytestmark = pytest.mark.kafka

QUEUES = 2
APP = "claims"


def adapter_on(tansu: Tansu, topic: str) -> KafkaAdapter:
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": QUEUES},
        "kafka": {"bootstrap": tansu.bootstrap, "topic": topic}})
    return KafkaAdapter(config.kafka, QUEUES)


def letters(count: int) -> list[DeadLetter]:
    return [DeadLetter.of(Message(f"m{n}", StreamId("jobs", f"k{n}"), b"{}",
                                  enqueued_at_ms=now_ms()), "jobs.handle", "boom", 1)
            for n in range(count)]


async def stored_letters(adapter: KafkaAdapter, count: int) -> list[StoredLetter]:
    """``count`` letters of APP stored on the adapter's (new) topic, as listed."""
    await adapter.ensure_topic()
    await adapter.dead_letters.put(APP, letters(count))
    return await adapter.dead_letters.page(APP, count + 10)


async def queued(adapter: KafkaAdapter) -> list[str]:
    """The letter ids the queues' messages were replayed from, one per message."""
    found: list[str] = []
    for queue in range(QUEUES):
        receiver = adapter.create_receiver(queue, APP)
        await receiver.initialize()
        try:
            while batch := await receiver.get_messages(100, 0.5):
                found += [m.headers.get(H_REPLAY_OF, "") for m in batch]
                await receiver.acknowledge([m.token for m in batch])
        finally:
            await receiver.shutdown()
    return found


async def test_a_late_claim_publishes_nothing_and_the_next_replay_takes_it_over(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    mapper = HashRingQueueMapper(QUEUES)
    first, second = adapter_on(tansu, topic), adapter_on(tansu, topic)
    try:
        stored = await stored_letters(first, 5)
        monkeypatch.setattr(kafka_letters, "CLAIM_PUBLISH_S", -1.0)  # every claim too late
        with pytest.raises(BrokerConnectionError, match="not published"):
            await dlq.replay(first, mapper, APP, stored)
        assert await first.dead_letters.count(APP) == 5
        assert await queued(first) == []
        monkeypatch.undo()
        # The first said it stopped: taken over at once, not after CLAIM_TTL_S (15 s).
        began = time.monotonic()
        report = await dlq.replay(second, mapper, APP,
                                  await second.dead_letters.page(APP, 10))
        assert time.monotonic() - began < kafka_letters.CLAIM_TTL_S / 2
        assert sorted(i for i, _ in report.replayed) == sorted(s.id for s in stored)
        assert await second.dead_letters.count(APP) == 0
        assert sorted(await queued(second)) == sorted(s.id for s in stored)  # once each
    finally:
        await first.close()
        await second.close()


async def test_a_claim_of_a_process_still_running_here_is_waited_for_however_old(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The two-operators test once published 50 letters twice: a replay held them past
    CLAIM_TTL_S on a loaded machine and two others took them over by age. On one machine
    the claim's process is looked at instead: a claim older than the TTL (shortened here
    to 0.5 s, so both the age and the clocks-apart fallback have long passed) is not
    taken over while its process runs; once that process ends, it is, at once."""
    monkeypatch.setattr(kafka_letters, "CLAIM_TTL_S", 0.5)
    mapper = HashRingQueueMapper(QUEUES)
    adapter = adapter_on(tansu, topic)
    holder = subprocess.Popen(  # noqa: ASYNC220 - started once, before the loop's work
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        stored = await stored_letters(adapter, 4)
        dead_letters = adapter.dead_letters
        assert isinstance(dead_letters, kafka_letters.KafkaDeadLetters)
        await dead_letters._write(APP, kafka_letters.LetterOp(  # a claim, as a replay writes it
            "replaying", [s.id for s in stored], 0, 0, "holder", now_ms() - 60_000,
            name_of(holder.pid), v=2))
        replay = asyncio.create_task(dlq.replay(adapter, mapper, APP, stored))
        done, _ = await asyncio.wait({replay}, timeout=3.0)  # 6x the TTL, 3x the fallback
        assert not done
        assert await queued(adapter) == []
        waiting = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
        assert waiting == [f"kafka: dead letters of {APP} are held by another replay that is "
                           f"still running (pid {holder.pid} on this machine); waiting for "
                           "it to end"], waiting  # once, however long it waits
        holder.communicate(b"")
        report = await asyncio.wait_for(replay, 10.0)
        assert sorted(i for i, _ in report.replayed) == sorted(s.id for s in stored)
        assert sorted(await queued(adapter)) == sorted(s.id for s in stored)  # once each
        assert await adapter.dead_letters.count(APP) == 0
    finally:
        if holder.returncode is None:
            holder.kill()
            holder.wait()
        await adapter.close()


async def test_a_replay_whose_publish_outlasts_its_claim_elsewhere_warns_of_twice(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The window that remains, between machines: a claim from another machine goes by
    age, so a publish slower than CLAIM_TTL_S (0.5 s here) is taken over meanwhile and
    both publish. Not silent: the slow replay says its letters may have been published
    twice. (Two machines, played here by claims that name no process.)"""
    monkeypatch.setattr(kafka_letters, "CLAIM_TTL_S", 0.5)
    monkeypatch.setattr(kafka_letters, "this_process", lambda: "")
    mapper = HashRingQueueMapper(QUEUES)
    slow, other = adapter_on(tansu, topic), adapter_on(tansu, topic)
    try:
        stored = await stored_letters(slow, 3)
        ids = sorted(s.id for s in stored)
        dead_letters = slow.dead_letters
        assert isinstance(dead_letters, kafka_letters.KafkaDeadLetters)
        publish, claimed = dead_letters._publish, asyncio.Event()

        async def slow_publish(queue: int, messages: Any) -> Any:
            claimed.set()
            await asyncio.sleep(1.5)  # the slow publish this test is about
            return await publish(queue, messages)

        monkeypatch.setattr(dead_letters, "_publish", slow_publish)
        first = asyncio.create_task(dlq.replay(slow, mapper, APP, stored))
        await asyncio.wait_for(claimed.wait(), 10.0)
        second = await dlq.replay(other, mapper, APP, await other.dead_letters.page(APP, 10))
        assert sorted(i for i, _ in second.replayed) == ids
        await asyncio.wait_for(first, 10.0)
        warned = [r.getMessage() for r in caplog.records if "published twice" in r.getMessage()]
        assert len(warned) == 1 and warned[0].endswith(f"({', '.join(ids)})"), warned
        assert sorted(await queued(other)) == sorted(ids * 2)  # the window, said
    finally:
        await slow.close()
        await other.close()


async def test_a_purge_of_more_letters_than_a_record_holds_is_written_in_several(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One record naming 120,000 purged ids was over the broker's 1 MB and the purge
    failed whole; the ids go OP_IDS_MAX to a record (3 here, to keep the test small)."""
    monkeypatch.setattr(kafka_letters, "OP_IDS_MAX", 3)
    adapter = adapter_on(tansu, topic)
    try:
        ids = [s.id for s in await stored_letters(adapter, 10)]
        assert await adapter.dead_letters.delete(APP, ids) == 10
        assert await adapter.dead_letters.count(APP) == 0
    finally:
        await adapter.close()
    reader = AIOKafkaConsumer(bootstrap_servers=tansu.bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tp = TopicPartition(f"{topic}.conveyor-dlq-ops", 0)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        end = (await reader.end_offsets([tp]))[tp]
        records = []
        while await reader.position(tp) < end:
            records += (await reader.getmany(tp, timeout_ms=1000)).get(tp, [])
    finally:
        await reader.stop()
    written = [msgspec.json.decode(r.value)["ids"] for r in records]
    assert [len(chunk) for chunk in written] == [3, 3, 3, 1]
    assert [i for chunk in written for i in chunk] == ids


async def test_a_purge_reads_only_the_range_of_its_letters(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`purge --all` deletes a page at a time: each delete read the whole dead-letter
    topic into a list (every body), a million letters' worth per page. It reads only
    the records from its first id's offset to its last's."""
    adapter = adapter_on(tansu, topic)
    read: list[tuple[str, int, int]] = []
    try:
        stored = await stored_letters(adapter, 30)
        real = adapter.dead_letters._records

        def records(tp: TopicPartition, start: int, end: int) -> Any:
            read.append((tp.topic, start, end))
            return real(tp, start, end)

        monkeypatch.setattr(adapter.dead_letters, "_records", records)
        chosen = stored[10:15]
        assert await adapter.dead_letters.delete(APP, [s.id for s in chosen]) == 5
        offsets = [kafka_letters.parse_id(s.id)[1] for s in chosen]
        letter_reads = [(start, end) for name, start, end in read
                        if name == f"{topic}.conveyor-dlq"]
        assert letter_reads == [(offsets[0], offsets[-1] + 1)]
        assert await adapter.dead_letters.count(APP) == 25
        assert await adapter.dead_letters.page(APP, 100) == stored[:10] + stored[15:]
    finally:
        await adapter.close()


async def test_two_purges_of_the_same_letters_at_once_count_each_letter_once(
    tansu: Tansu, topic: str,
) -> None:
    """Each purge read the letters still stored, then recorded them purged: two at once
    both counted the letters the other had recorded first (`conveyor dlq purge --all`
    twice on 50,000 letters said 40,580 and 40,720). A letter is the purge's whose record
    removes it first, as every reader of the ops topic agrees."""
    first, second = adapter_on(tansu, topic), adapter_on(tansu, topic)
    try:
        stored = await stored_letters(first, 200)
        ids = [s.id for s in stored]
        counts = await asyncio.gather(first.dead_letters.delete(APP, ids),
                                      second.dead_letters.delete(APP, ids))
        assert sum(counts) == len(stored) == 200, counts
        assert await first.dead_letters.count(APP) == 0
        assert await first.dead_letters.delete(APP, ids) == 0  # a third finds none
    finally:
        await first.close()
        await second.close()
