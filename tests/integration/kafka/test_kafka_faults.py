"""Broker faults: a daemon started before its broker backs off and resumes."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.connection import FIRST_ANSWER_S
from conveyor.client import Client, Publish
from conveyor.platform.errors import ConfigError
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import free_port, wait_until, wait_until_sync
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import (
    CuttableProxy,
    Recorder,
    kafka_config,
    nothing_left_unacknowledged,
)
from tests.servers.tansu import require_tansu

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[3]


def _late_broker(tmp_path: Path) -> Tansu:
    return Tansu(require_tansu(), free_port(), tmp_path / "late-tansu.log")


@pytest.mark.parametrize("balancer", ["static", "kafka-group"])
async def test_a_daemon_whose_broker_is_unreachable_resumes_when_it_comes_up(
    tansu: Tansu, topic: str, tmp_path: Path, balancer: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    broker = _late_broker(tmp_path)
    config = kafka_config(broker.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": balancer})
    rec = Recorder()
    daemon = WorkerDaemon(rec.app, config)
    t0 = time.monotonic()
    await daemon.start()  # nothing listens yet: start returns and the adapter backs off
    assert time.monotonic() - t0 < 5, "start must not block on a broker that is down"
    items = [Publish("orders", f"k{i % 5}", {"k": f"k{i % 5}", "seq": i // 5})
             for i in range(40)]
    try:
        await wait_until(lambda: any("unreachable while" in r.getMessage()
                                     for r in caplog.records), 15, 0.05,
                         "the outage to be noticed and logged")
        await asyncio.sleep(0.5)  # several more poll intervals (200 ms): still logged once
        broker.start()
        async with Client.from_config(config) as client:
            await client.publish_batch(items)
        await wait_until(lambda: len(rec.seen) >= len(items), 60, 0.05,
                         "handled after the outage")
        await wait_until(lambda: nothing_left_unacknowledged(daemon), 15, 0.1,
                         "every message acknowledged: none can come again")
    finally:
        await daemon.stop()
        broker.stop()
    # Nothing was in flight during the outage, so no duplicate is allowed.
    assert sorted(rec.seen) == sorted((p.key, p.body["seq"]) for p in items)
    for key, seqs in rec.by_key.items():
        assert seqs == sorted(seqs), key
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("unreachable while" in w for w in warnings) == 1, warnings
    assert any("reachable again" in w for w in warnings), warnings
    assert not any("pull failed" in w for w in warnings), "the outage was logged per poll"


@pytest.mark.parametrize("balancer", ["static", "kafka-group"])
async def test_a_broker_outage_mid_run_loses_nothing(
    tansu: Tansu, topic: str, tmp_path: Path, balancer: str
) -> None:
    """The network to the broker is cut for 3 s while messages are being handled.

    aiokafka reconnects by itself (it logs each failed attempt); the daemon goes on.
    """
    broker = _late_broker(tmp_path)
    proxy = CuttableProxy(free_port(), broker.port)
    broker.advertised_port = proxy.port  # every client connection goes through the proxy
    config = kafka_config(broker.bootstrap, topic, queues={"total": 2},
                          balancer={"kind": balancer})
    rec = Recorder(max_delay_s=0.005)
    daemon = WorkerDaemon(rec.app, config)
    items = [Publish("orders", f"k{i % 10}", {"k": f"k{i % 10}", "seq": i // 10})
             for i in range(600)]
    try:
        await proxy.start()
        broker.start()
        async with Client.from_config(config) as client:
            await client.publish_batch(items[:300])
        await daemon.start()
        await wait_until(lambda: len(rec.seen) >= 50, 30, 0.01, "work under way")
        await proxy.cut()
        cut_at = len(rec.seen)
        await asyncio.sleep(3.0)  # the outage under test (below session_timeout_ms = 6 s)
        await proxy.start()
        async with Client.from_config(config) as client:
            await client.publish_batch(items[300:])
        await wait_until(lambda: len(set(rec.seen)) >= len(items), 60, 0.05,
                         "everything handled after the outage")
        await wait_until(lambda: nothing_left_unacknowledged(daemon), 15, 0.1,
                         "every message acknowledged: none can come again")
    finally:
        await daemon.stop()
        await proxy.cut()
        broker.stop()
    assert cut_at < 300, "the cut came after the first batch was done"
    assert set(rec.seen) == {(p.key, p.body["seq"]) for p in items}
    # Neither the position nor the group membership is lost in an outage shorter than
    # the session timeout, so nothing is redelivered: no duplicate is allowed.
    assert len(rec.seen) == len(items), f"{len(rec.seen) - len(items)} duplicate(s)"
    for key, seqs in rec.by_key.items():
        assert seqs == sorted(seqs), key


@pytest.mark.parametrize("balancer", ["static", "kafka-group"])
async def test_a_broker_that_never_answers_holds_up_neither_start_nor_stop(
    topic: str, balancer: str
) -> None:
    """A host that accepts connections and stays silent (aiokafka would wait 40 s)."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = kafka_config(f"127.0.0.1:{port}", topic, queues={"total": 3},
                          balancer={"kind": balancer})
    daemon = WorkerDaemon(Recorder().app, config)
    try:
        t0 = time.monotonic()
        await daemon.start()
        started_s = time.monotonic() - t0
        await asyncio.sleep(0.5)  # pulls run against the silent broker meanwhile
        t0 = time.monotonic()
        await daemon.stop()
        stopped_s = time.monotonic() - t0
    finally:
        for writer in held:
            writer.close()
        server.close()
    # One bounded wait for a first answer (FIRST_ANSWER_S = 5 s), not one per queue
    # (3 x 5 s); before, start waited out aiokafka's 40 s request timeout.
    assert started_s < 2 * FIRST_ANSWER_S, started_s
    assert stopped_s < 3, stopped_s
    assert held, "the daemon never tried the broker"


async def test_a_topic_with_too_few_partitions_is_not_retried(
    tansu: Tansu, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kafka-group: raised by start when the broker answers, logged once if it comes later."""
    broker = _late_broker(tmp_path)
    proxy = CuttableProxy(free_port(), broker.port)
    broker.advertised_port = proxy.port
    daemon: WorkerDaemon | None = None
    try:
        broker.start()
        await proxy.start()
        config = kafka_config(broker.bootstrap, topic, queues={"total": 2},
                              balancer={"kind": "kafka-group"})
        one = KafkaAdapter(config.kafka, 1)
        try:
            await one.ensure_topic()  # the topic, with 1 partition
        finally:
            await one.close()
        with pytest.raises(ConfigError, match="has 1 partitions"):
            await WorkerDaemon(Recorder().app, config).start()
        await proxy.cut()  # the broker unreachable: start returns, the join goes on
        daemon = WorkerDaemon(Recorder().app, config)
        await daemon.start()
        await proxy.start()
        await wait_until(lambda: any("joining failed for good" in r.getMessage()
                                     for r in caplog.records), 30, 0.05, "the error logged")
        assert daemon.balancer.owned() == []
        # ...and the daemon is told, so `conveyor worker` stops and exits non-zero
        # rather than idling forever with no queue.
        assert daemon.failed.is_set()
        assert isinstance(daemon.failure, ConfigError), daemon.failure
    finally:
        if daemon is not None:
            await daemon.stop()
        await proxy.cut()
        broker.stop()


def test_a_worker_waiting_for_its_broker_drains_on_sigterm(tmp_path: Path) -> None:
    """configs/kafka.toml (kafka-group) against a closed port: waits, then exits 0."""
    port = free_port()  # nothing listens here
    cfg = tmp_path / "kafka.toml"
    cfg.write_text((REPO / "configs" / "kafka.toml").read_text()
                   .replace("127.0.0.1:9092", f"127.0.0.1:{port}"))
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(tmp_path / "out.txt"),
           "PYTHONWARNINGS": "always::ResourceWarning"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/kafka_app.py:app",
         "--config", str(cfg)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    try:
        assert worker.stderr is not None
        os.set_blocking(worker.stderr.fileno(), False)

        def waiting() -> bool:
            lines.extend(worker.stderr.readlines())  # type: ignore[union-attr]
            return (any("waiting for the consumer group" in line for line in lines)
                    or worker.poll() is not None)

        wait_until_sync(waiting, 30, "the worker saying what it waits for, its broker down")
        assert worker.poll() is None, "".join(lines)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(15) == 0, "".join(lines)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    os.set_blocking(worker.stderr.fileno(), True)
    text = "".join(lines) + worker.stderr.read()
    assert "unreachable while joining group" in text, text
    assert "drained" in text, text
    assert not re.search(r"worker \S+ ready", text), text  # it never owned a partition
    assert "Unclosed" not in text and "Traceback" not in text, text
