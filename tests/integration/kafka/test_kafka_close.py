"""Closing a Kafka client while cancelled publishes are still in the producer, the broker
not answering (tansu SIGSTOPped, one of this test's own).

The close drops what the producer holds (``KafkaCluster.abandon_sends``): each batch
fails with ``ShutdownError``. Nobody waited for the batches of the cancelled publishes,
and asyncio logged "Future exception was never retrieved" for such futures as they were
collected, at the latest at the process's exit (a script's, or a stopping worker's): the
shields ``send_batch`` returned to a publish cancelled between two of its batches, a
batch's own future once its publish stopped waiting for it, and the drain waiter of a
batch queued behind the one in flight. Before the fix ten runs out of ten printed them.

The scenario runs in a process of its own (:func:`close_with_cancelled_publishes`):
what the test reads is that process's stderr, as an operator would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.client import Client
from conveyor.platform.errors import ShutdownError
from conveyor.platform.message import Message
from tests.conftest import process_stopped, wait_until
from tests.integration.kafka.helpers import kafka_config
from tests.integration.redis.conftest import REPO
from tests.servers.tansu import start_tansu

pytestmark = pytest.mark.kafka

PAD = "x" * 400
"""A body's padding: 40 such records fill a record batch (16 KiB)."""

SCRIPT = """
import asyncio, gc, sys
from tests.integration.kafka.test_kafka_close import close_with_cancelled_publishes
asyncio.run(close_with_cancelled_publishes(sys.argv[1], sys.argv[2], int(sys.argv[3])))
gc.collect()  # what the exit would collect, while stderr surely still takes it
"""


def held(producer: AIOKafkaProducer, tp: TopicPartition) -> tuple[int, int]:
    """The batches of ``tp`` the producer holds: (sent, queued behind them)."""
    accumulator = producer._message_accumulator
    sent = sum(b.tp == tp for b in accumulator._pending_batches)
    return sent, len(accumulator._batches.get(tp, ()))


async def close_with_cancelled_publishes(bootstrap: str, topic: str, broker_pid: int) -> None:
    """Publish to three queues, stop the broker (SIGSTOP; the test resumes it), cancel
    two of the publishes, close the client; print what the third send was told."""
    client = Client.from_config(kafka_config(bootstrap, topic, queues={"total": 4}))
    adapter = client.adapter
    assert isinstance(adapter, KafkaAdapter)
    await client.publish("orders", "warm", {"seq": -1})  # connected, metadata in
    producer = await adapter.producer()
    tps = [TopicPartition(topic, q) for q in range(3)]

    def messages(n: int) -> list[Message]:
        return [client.build("orders", f"k{i}", {"seq": i, "pad": PAD}) for i in range(n)]

    os.kill(broker_pid, signal.SIGSTOP)
    # Not answering only once every thread has stopped: a send right after the kill was
    # now and then still answered, and the batches below never all held.
    await wait_until(lambda: process_stopped(broker_pid), 5, what="the broker stopped")
    # queue 0: two batches, both handed over; the publish waits for their answers.
    # queue 1: five; it waits to hand over the third (the second is queued).
    awaiting = asyncio.create_task(adapter.enqueue(0, messages(60)))
    handing = asyncio.create_task(adapter.enqueue(1, messages(200)))
    await wait_until(lambda: held(producer, tps[0]) == (1, 1)
                     and held(producer, tps[1]) == (1, 1), 20,
                     what="a batch of queues 0 and 1 in flight, one queued behind")
    # queue 2: a send still waited for when the client closes
    builder = producer.create_batch()
    builder.append(key=b"k", value=b"{}", timestamp=None)
    waited = await producer.send_batch(builder, topic, partition=2)
    for task in (awaiting, handing):
        task.cancel()
    outcomes = await asyncio.gather(awaiting, handing, return_exceptions=True)
    print("publishes:", " ".join(type(o).__name__ for o in outcomes))
    await client.close()
    try:
        await waited
    except ShutdownError:
        print("the waited send: ShutdownError")


def run_on_own_broker(script: str, tmp_path: Path, topic: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a Python of its own (its stderr is what an operator sees), given a
    tansu broker of this test's own — its bootstrap, ``topic`` and the broker's pid, to
    stop it — and that broker resumed and stopped after."""
    broker = start_tansu(tmp_path)
    assert broker.proc is not None
    try:
        return subprocess.run(
            [sys.executable, "-c", script, broker.bootstrap, topic, str(broker.proc.pid)],
            cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        broker.proc.send_signal(signal.SIGCONT)
        broker.stop()


def test_a_close_dropping_cancelled_publishes_leaves_no_unretrieved_future(
    tmp_path: Path, topic: str
) -> None:
    run = run_on_own_broker(SCRIPT, tmp_path, topic)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "publishes: CancelledError CancelledError",
        "the waited send: ShutdownError",  # a send someone waits for is still told
    ], run.stderr
    assert "never retrieved" not in run.stderr, run.stderr
