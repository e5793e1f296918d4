"""One trace across processes: Client here (in-memory exporter), worker there (OTLP)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor import Client, load_config
from conveyor.platform.adapter import create_adapter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.telemetry import Telemetry
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import RedisServer, write_config
from tests.otlp import Receiver, otlp_receiver

__all__ = ["otlp_receiver"]
ROOT = Path(__file__).resolve().parents[3]


def test_a_message_published_here_and_handled_by_a_worker_process_is_one_trace(
    redis_server: RedisServer, otlp_receiver: tuple[str, Receiver], tmp_path: Path
) -> None:
    endpoint, received = otlp_receiver
    cfg_path = write_config(tmp_path / "c.toml", redis_server.url)
    out = tmp_path / "handled.txt"
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out),
           "CONVEYOR_TELEMETRY__EXPORTER": "otlp", "CONVEYOR_TELEMETRY__ENDPOINT": endpoint,
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.traced_handler:app",
         "--config", str(cfg_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))

    async def publish() -> None:
        config = load_config(cfg_path, environ={})
        client = Client(create_adapter("redis", config), HashRingQueueMapper(8),
                        telemetry=Telemetry(provider), owns_adapter=True)
        async with client:
            await client.publish("jobs", "k1", {"seq": 1})

    try:
        asyncio.run(publish())
        wait_until_sync(lambda: out.exists() and out.read_text().split() == ["1"], 30,
                        what="the worker to handle the message")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    [producer] = spans.get_finished_spans()
    assert producer.attributes is not None
    assert producer.attributes["messaging.system"] == "redis"
    consumers = [s for _, s in received.spans if s.kind == Span.SPAN_KIND_CONSUMER]
    [consumer] = consumers
    assert int.from_bytes(consumer.trace_id, "big") == producer.context.trace_id
    assert int.from_bytes(consumer.parent_span_id, "big") == producer.context.span_id
    attrs = {a.key: a.value.string_value for a in consumer.attributes}
    assert attrs["messaging.system"] == "redis"
    assert attrs["messaging.consumer.group.name"] == "traced-redis"
