"""Config and app builders shared by the Kafka tests."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Any

from conveyor.platform.app import App
from conveyor.platform.config import Config, load_config


def kafka_config(bootstrap: str, topic: str, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "queues": {"adapter": "kafka", "total": 1},
        "kafka": {"bootstrap": bootstrap, "topic": topic, "session_timeout_ms": 6000,
                  "heartbeat_interval_ms": 500},
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 200, "drain_timeout_s": 5.0},
    }
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, environ={}, overrides=overrides)


class Recorder:
    """An app whose handler records (key, seq) per namespace, optionally sleeping."""

    def __init__(
        self, namespace: str = "orders", max_delay_s: float = 0.0, min_delay_s: float = 0.0
    ) -> None:
        self.app = App("kafka-test")
        self.seen: list[tuple[str, int]] = []
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.max_delay_s = max_delay_s
        self.min_delay_s = min_delay_s
        self.hold: dict[str, asyncio.Event] = {}
        self.running = 0
        self.peak = 0
        self.first_call_at: float | None = None
        """perf_counter() when the first handler call began; last_done_at: the last ended."""
        self.last_done_at = 0.0

        @self.app.handler(namespace)
        async def handle(body: dict[str, Any]) -> None:
            key, seq = str(body["k"]), int(body["seq"])
            if self.first_call_at is None:
                self.first_call_at = time.perf_counter()
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                gate = self.hold.get(key)
                if gate is not None:
                    await gate.wait()
                if self.max_delay_s:
                    await asyncio.sleep(random.uniform(self.min_delay_s, self.max_delay_s))
            finally:
                self.running -= 1
            self.seen.append((key, seq))
            self.by_key[key].append(seq)
            self.last_done_at = time.perf_counter()


class CuttableProxy:
    """A TCP proxy in front of a broker that a test can cut (an outage) and restore.

    While cut, it refuses connections and has closed every open one, as a network
    partition or a broker host that is down would look to the client.
    """

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, RuntimeError):
            return  # the proxy was cut: the connection ends here
        finally:
            writer.close()
            self._writers.discard(writer)
