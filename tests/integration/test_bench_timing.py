"""The throughput benchmark times up to the acknowledgements, not the handler's return."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from conveyor.adapters.memory import MemoryAdapter, MemoryReceiver, reset_broker
from conveyor.bench.throughput import _pipeline
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.config import Config
from conveyor.platform.ids import SequenceToken

ACK_DELAY_S = 0.5


class SlowAckReceiver(MemoryReceiver):
    async def messages_delivered(self, tokens: Sequence[SequenceToken]) -> None:
        await asyncio.sleep(ACK_DELAY_S)  # the injected fault: a backend slow to ack
        await super().messages_delivered(tokens)


class SlowAckAdapter(MemoryAdapter):
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        return SlowAckReceiver(self.broker, queue, group)


async def test_pipeline_timer_waits_for_every_ack() -> None:
    def make() -> SlowAckAdapter:
        reset_broker("slow-ack")
        return SlowAckAdapter("slow-ack")

    n = 200
    config = Config()
    rate, _ = await _pipeline(make, config, n, streams=20)
    # Every ack takes ACK_DELAY_S, so no run can finish faster than that; a timer that
    # stopped when the handler had seen n messages would report thousands per second.
    assert rate <= n / ACK_DELAY_S
