"""A publish cancelled while the broker is slow (a handler's ``asyncio.wait_for`` around
it), whose records then fail in the producer on the broker's account: the request timed
out. No close is involved: the client stays open until every batch has failed.

``send_batch`` hands out a shield of each batch's own future. Cancelled while awaiting
the shields, the publish cancels them, and a cancelled shield no longer reads its
batch's future; aiokafka reads it on failure only for ``send``'s batches (with
per-message futures), never for ``send_batch``'s. asyncio then logged "Future exception
was never retrieved ... RequestTimedOutError" for each such batch once it was collected
(six runs in six before the fix), whether the publish had one batch or more. A single
message (``send``) never did: the cancelled wait cancels its own future.

The producer is not idempotent (``$.kafka.idempotence = "off"``; tansu hands out no
producer ids, so "auto" is the same here): an idempotent producer retries a timed-out
batch until the broker answers, and the batch never fails. The producer's request
timeout is 2 s rather than its 40 s (Conveyor's config has no setting for it: the
scenario sets it in the options its cluster starts the producer with). The scenario runs
in a process of its own (:func:`cancel_then_time_out`): what the test reads is that
process's stderr, as an operator would.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.client import Client
from conveyor.platform.message import Message
from tests.conftest import process_stopped, wait_until
from tests.integration.kafka.helpers import kafka_config
from tests.integration.kafka.test_kafka_close import PAD, held, run_on_own_broker

pytestmark = pytest.mark.kafka

REQUEST_TIMEOUT_MS = 2000

SCRIPT = """
import asyncio, gc, sys
from tests.integration.kafka.test_kafka_cancelled_publish import cancel_then_time_out
asyncio.run(cancel_then_time_out(sys.argv[1], sys.argv[2], int(sys.argv[3])))
gc.collect()
"""


def holds_nothing(producer: AIOKafkaProducer) -> bool:
    accumulator = producer._message_accumulator
    return not accumulator._pending_batches and not any(accumulator._batches.values())


async def cancel_then_time_out(bootstrap: str, topic: str, broker_pid: int) -> None:
    """Stop the broker (SIGSTOP; the test resumes it); publish to four queues under a
    1 s ``wait_for`` (the fourth one awaited to its end); wait until every batch has
    failed by request timeout; collect; print what each publish raised."""
    client = Client.from_config(kafka_config(
        bootstrap, topic, queues={"total": 4}, kafka={"idempotence": "off"}))
    adapter = client.adapter
    assert isinstance(adapter, KafkaAdapter)
    adapter.cluster.options["request_timeout_ms"] = REQUEST_TIMEOUT_MS  # before it starts
    await client.publish("orders", "warm", {"seq": -1})  # connected, metadata in
    producer = await adapter.producer()
    assert producer._request_timeout_ms == REQUEST_TIMEOUT_MS

    def messages(n: int) -> list[Message]:
        return [client.build("orders", f"k{i}", {"seq": i, "pad": PAD}) for i in range(n)]

    async def outcome(queue: int, n: int, timeout_s: float) -> str:
        try:
            await asyncio.wait_for(adapter.enqueue(queue, messages(n)), timeout_s)
        except Exception as exc:
            return type(exc).__name__
        return "published"

    os.kill(broker_pid, signal.SIGSTOP)
    await wait_until(lambda: process_stopped(broker_pid), 5, what="the broker stopped")
    # queue 0: two batches, both handed over (the publish awaits them together);
    # queue 1: one batch (the common publish); queue 2: one message (``send``);
    # queue 3: one batch, awaited until the broker's error.
    outcomes = [asyncio.create_task(outcome(0, 60, 1.0)), asyncio.create_task(outcome(1, 5, 1.0)),
                asyncio.create_task(outcome(2, 1, 1.0)), asyncio.create_task(outcome(3, 5, 30))]
    cancelled = await asyncio.gather(*outcomes[:3])
    handed = [sum(held(producer, TopicPartition(topic, q))) for q in range(4)]
    assert handed == [2, 1, 1, 1], f"batches handed over by queue: {handed}"
    await wait_until(lambda: holds_nothing(producer), 10 * REQUEST_TIMEOUT_MS / 1000,
                     what="every batch failed")
    print("cancelled:", *cancelled)
    print("awaited:", await outcomes[3])
    gc.collect()  # the failed batches' futures: any unread error is logged now
    await client.close()


def test_a_cancelled_publish_whose_batches_fail_later_leaves_no_unretrieved_future(
    tmp_path: Path, topic: str
) -> None:
    run = run_on_own_broker(SCRIPT, tmp_path, topic)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "cancelled: TimeoutError TimeoutError TimeoutError",  # as the handler's wait_for
        "awaited: PublishUncertain",  # the request timed out: it may have been stored
    ], run.stderr
    assert "RequestTimedOutError" in run.stderr, run.stderr  # the batches did fail so
    assert "never retrieved" not in run.stderr, run.stderr
