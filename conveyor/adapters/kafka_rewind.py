"""Moving an app's position on Kafka partitions: to a sequence token or a point in time.

A token names its offset; a time is resolved per partition to the first record at or
after it (``offsets_for_times``, or a scan of record timestamps where the broker cannot
answer, as on tansu). The new position is committed for the app's group, with a
hand-off record that forgets the done offsets recorded above the old watermark.

Moving *forward* (a target past the committed position) would commit past messages
never handled and silently skip them, so it is refused unless asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka_conn import broker_error, fetch_committed
from conveyor.platform.errors import BrokerError, ForwardRewindError
from conveyor.platform.ids import SequenceToken

if TYPE_CHECKING:
    from conveyor.adapters.kafka import KafkaAdapter

log = logging.getLogger("conveyor.kafka")


async def rewind_queues(adapter: KafkaAdapter, queues: Sequence[int], group: str,
                        to: SequenceToken | float, *, allow_forward: bool = False) -> None:
    """Move ``group``'s position on every queue of ``queues`` to ``to``.

    A target ahead of the committed position (a later token, or a time after the last
    message) would skip messages never handled: refused with
    :class:`ForwardRewindError` unless ``allow_forward``, checked on every queue before
    any is moved. Partitions are then committed one at a time: if one fails, the error
    names the queues already moved (re-running the same rewind finishes the job).
    """
    try:
        targets: dict[int, int] = {}
        ahead: list[str] = []
        for queue in queues:
            offset, position = await _target_and_position(adapter, queue, group, to)
            if offset > position:
                ahead.append(f"queue {queue}: offset {offset} > {position}, "
                             f"{offset - position} message(s) skipped")
            targets[queue] = offset
        if ahead and not allow_forward:
            raise ForwardRewindError(
                f"that target is ahead of app {group!r}'s position, so messages never "
                f"handled would be skipped ({'; '.join(ahead)}); pass --allow-forward "
                "(allow_forward=True) to skip them on purpose"
            )
        moved: list[int] = []
        for queue, offset in targets.items():
            try:
                await _commit_position(adapter, group, queue, offset)
            except (kerrors.KafkaError, OSError, BrokerError) as exc:
                if not moved:
                    raise
                # Commits go one partition at a time: say which ones already moved.
                raise BrokerError(
                    f"rewinding app {group!r} failed on queue {queue} ({exc}); queues "
                    f"{moved} were already moved: re-run the same rewind to finish"
                ) from exc
            moved.append(queue)
            log.info("moved %s on queue %d to offset %d", group, queue, offset)
    except (kerrors.KafkaError, OSError) as exc:
        raise broker_error(f"rewinding app {group!r}", exc) from exc


async def forward_gap(adapter: KafkaAdapter, queue: int, group: str,
                      to: SequenceToken | float) -> int:
    """Messages between the group's committed position and ``to``, when ``to`` is ahead."""
    try:
        offset, position = await _target_and_position(adapter, queue, group, to)
    except (kerrors.KafkaError, OSError) as exc:
        raise broker_error(f"reading app {group!r}'s position", exc) from exc
    return max(0, offset - position)


async def _target_and_position(adapter: KafkaAdapter, queue: int, group: str,
                               to: SequenceToken | float) -> tuple[int, int]:
    """The offset ``to`` names on ``queue``, and the group's committed position there."""
    consumer = await adapter.probe(group)
    tp = TopicPartition(adapter.topic, queue)
    if isinstance(to, SequenceToken):
        if to.queue != queue:
            raise BrokerError(f"token {to} is for queue {to.queue}, not {queue}")
        offset = to.major
    else:
        offset = await offset_for_time(adapter, consumer, tp, int(to * 1000))
    committed = await fetch_committed(consumer, tp)
    position = (int(committed[0]) if committed is not None
                else int((await consumer.beginning_offsets([tp]))[tp]))
    return offset, position


async def _commit_position(adapter: KafkaAdapter, group: str, queue: int, offset: int) -> None:
    consumer = await adapter.probe(group)
    tp = TopicPartition(adapter.topic, queue)
    await adapter.handoffs.write(group, queue, offset, "")  # forget recorded done offsets
    try:
        await consumer.commit({tp: OffsetAndMetadata(offset, "")})
    except kerrors.CommitFailedError:
        # A broker that refuses commits from outside the group's generation
        # (tansu, once a group had members): commit as its only member.
        await _commit_as_member(adapter, group, {tp: OffsetAndMetadata(offset, "")})


async def _commit_as_member(
    adapter: KafkaAdapter, group: str, offsets: dict[TopicPartition, OffsetAndMetadata]
) -> None:
    consumer = adapter.new_consumer(group, session_timeout_ms=adapter.config.session_timeout_ms)
    await consumer.start()
    try:
        consumer.subscribe([adapter.topic])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + adapter.config.session_timeout_ms / 1000 + 10
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


async def offset_for_time(adapter: KafkaAdapter, consumer: AIOKafkaConsumer,
                          tp: TopicPartition, when_ms: int) -> int:
    """The first offset whose timestamp is >= ``when_ms`` (the end if none is)."""
    found = (await consumer.offsets_for_times({tp: when_ms})).get(tp)
    if found is not None and found.timestamp >= 0:
        return int(found.offset)
    # No answer, or tansu's (timestamp -1): scan from the start up to the fetch
    # high watermark, comparing record timestamps.
    begin = (await consumer.beginning_offsets([tp]))[tp]
    high = await adapter.high_watermark(consumer, tp, begin)
    consumer.seek(tp, begin)
    position = begin
    while position < high:
        batch = (await consumer.getmany(tp, timeout_ms=500, max_records=500)).get(tp, [])
        for record in batch:
            if record.timestamp >= when_ms:
                return int(record.offset)
            position = record.offset + 1
    return high
