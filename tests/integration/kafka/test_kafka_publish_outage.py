"""A publish under way when the broker becomes unreachable ends within
``[kafka] publish_timeout_ms`` of the broker's last answer, saying by id which messages
were stored, which were not and which may or may not have been; once the broker is back
the same client publishes again, and the topic holds exactly what the error said.

Before the bound, the call waited for the broker as long as the outage lasted (100,000
messages, a cut 0.3 s in: 61.8 s for a 60 s outage, 201.5 s for 200 s): aiokafka retries
a batch whose connection failed until the broker answers (an idempotent producer
forever; a plain one until the batch is ``request_timeout_ms``, 40 s, old, and the call
hands each next batch over only as the one before it leaves, so every batch is young).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import msgspec
import pytest

from conveyor.client import Client, Publish
from conveyor.platform.config import Config
from conveyor.platform.errors import BrokerConnectionError, PartialPublishError, PublishUncertain
from tests.conftest import free_port, wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import CuttableProxy, kafka_config, read_all
from tests.servers.tansu import require_tansu

pytestmark = pytest.mark.kafka

QUEUES = 3
N = 100_000
BOUND_MS = 3000
"""``publish_timeout_ms`` here (30 s shipped)."""
OUTAGE_S = 10.0
"""How long the proxy stays cut: well past the bound."""
SLACK_S = 1.5
"""What a call may take past the bound: the turn of the loop that notices, the error built."""
BATCH_BYTES = 16_384
"""aiokafka's ``max_batch_size``: one record batch (one partition) holds at most this."""


@asynccontextmanager
async def behind_a_proxy(tmp_path: Path, publish_timeout_ms: int
                         ) -> AsyncIterator[tuple[Config, CuttableProxy]]:
    """A broker every connection reaches through a proxy the test can cut, and a config
    of a topic of its own on it, publishes bounded by ``publish_timeout_ms``."""
    broker = Tansu(require_tansu(), free_port(), tmp_path / "tansu.log")
    proxy = CuttableProxy(free_port(), broker.port)
    broker.advertised_port = proxy.port
    config = kafka_config(broker.bootstrap, f"out-{free_port()}",
                          kafka={"publish_timeout_ms": publish_timeout_ms})
    try:
        await proxy.start()
        broker.start()
        yield config, proxy
    finally:
        await proxy.cut()
        broker.stop()


async def test_a_publish_during_an_outage_ends_within_the_publish_timeout(
    tmp_path: Path,
) -> None:
    broker = Tansu(require_tansu(), free_port(), tmp_path / "tansu.log")
    proxy = CuttableProxy(free_port(), broker.port)
    broker.advertised_port = proxy.port  # every connection goes through the proxy
    config = kafka_config(broker.bootstrap, topic := f"out-{free_port()}",
                          queues={"total": QUEUES}, kafka={"publish_timeout_ms": BOUND_MS})
    ended: dict[str, float] = {}

    def stamp(name: str, _: object) -> None:
        ended[name] = time.monotonic()

    try:
        await proxy.start()
        broker.start()
        async with Client.from_config(config) as client:
            # The batch goes to queues 0 and 1; "alone" is a stream of queue 2.
            keys = [k for k in (f"k{i}" for i in range(300))
                    if client.queue_for("orders", k) != 2][:100]
            alone = next(k for k in (f"a{i}" for i in range(300))
                         if client.queue_for("orders", k) == 2)
            items = [Publish("orders", keys[i % 100], {"seq": i}) for i in range(N)]
            later = [Publish("orders", keys[i % 100], {"seq": N + 2 + i}) for i in range(200)]
            await client.publish("orders", "warm", {"seq": -1})  # connected, metadata in
            before = proxy.forwarded
            calls = {"batch": asyncio.create_task(client.publish_batch(items))}
            await wait_until(lambda: proxy.forwarded - before > 1 << 20, 30, 0.001,
                             "the batch's first MiB on its way")
            assert not calls["batch"].done(), "the batch was sent before the cut: raise N"
            await proxy.cut()
            cut_at = time.monotonic()
            calls["behind"] = asyncio.create_task(client.publish("orders", keys[0], {"seq": N}))
            calls["alone"] = asyncio.create_task(client.publish("orders", alone, {"seq": N + 1}))
            for name, call in calls.items():
                call.add_done_callback(partial(stamp, name))
            await asyncio.wait(calls.values(), timeout=OUTAGE_S)
            await proxy.start()  # the broker is back
            batch_error, behind_error, alone_error = await asyncio.gather(
                *calls.values(), return_exceptions=True)
            late = {name: round(at - cut_at, 1) for name, at in ended.items()}
            assert max(late.values()) <= BOUND_MS / 1000 + SLACK_S, (
                f"seconds after the cut each call ended: {late}")
            tokens = await asyncio.wait_for(client.publish_batch(later), 30)
            assert len(tokens) == len(later)
        records = await read_all(broker.bootstrap, topic, len(later), QUEUES)
    finally:
        await proxy.cut()
        broker.stop()

    assert isinstance(batch_error, PartialPublishError), repr(batch_error)
    stored, failed = batch_error.published, set(batch_error.failed)
    uncertain = set(batch_error.uncertain)
    assert stored and failed, (len(stored), len(failed), len(uncertain))
    assert len(stored) + len(failed) + len(uncertain) == N
    seqs = Counter(msgspec.json.decode(r.value)["seq"] for r in records)
    ids = Counter(dict(r.headers)["cv-id"].decode() for r in records)
    where = {dict(r.headers)["cv-id"].decode(): (r.partition, r.offset)
             for r in sorted(records, key=lambda r: -r.offset)}  # each id's first record
    # Everything reported stored is where its token says; nothing reported failed is
    # there; whatever else of the batch is there is among the ids it reported in doubt.
    assert all(where[i] == (t.queue, t.major) for i, t in stored.items())
    assert not failed & set(ids)
    batch_ids = set(stored) | failed | uncertain
    assert (set(ids) & batch_ids) - set(stored) <= uncertain
    # "behind" waited for room behind the batch's record batches: not sent (or, had the
    # producer's sender just taken them all, in doubt). "alone" went out: in doubt.
    if isinstance(behind_error, PublishUncertain):
        assert len(behind_error.message_ids) == 1
    else:
        assert isinstance(behind_error, BrokerConnectionError), repr(behind_error)
        assert "nothing was sent" in str(behind_error)
        assert seqs[N] == 0, "a publish reported not sent was stored"
    assert isinstance(alone_error, PublishUncertain), repr(alone_error)
    assert seqs[N + 1] <= 1
    # Published after the broker came back: each exactly once.
    assert all(seqs[p.body["seq"]] == 1 for p in later)
    # No idempotence on tansu: the produce request cut in flight may be re-sent once the
    # broker is back (at most one batch per partition), so only ids in doubt come twice.
    doubled = {i for i, n in ids.items() if n > 1}
    assert doubled <= uncertain, len(doubled - uncertain)
    smallest = min(len(r.key) + len(r.value) + sum(len(k) + len(v) for k, v in r.headers)
                   for r in records)
    assert sum(ids[i] - 1 for i in doubled) <= QUEUES * (BATCH_BYTES // smallest)


async def test_a_client_closed_in_the_outage_after_its_publish_gave_up_closes_at_once(
    tmp_path: Path,
) -> None:
    """The producer keeps retrying a batch in doubt until the broker answers. Once its
    publish has given up nobody waits for it, so a close during the outage drops it
    (it stays in doubt, as the publish said) instead of waiting: for aiokafka's request
    timeout (40 s) on a plain producer, for ever on an idempotent one."""
    async with behind_a_proxy(tmp_path, 1000) as (config, proxy):
        async with Client.from_config(config) as client:
            await client.publish("orders", "warm", {"seq": -1})
            await proxy.cut()
            with pytest.raises(PublishUncertain) as raised:
                await client.publish_batch([Publish("orders", "k", {"seq": i})
                                            for i in range(10)])
            assert len(raised.value.message_ids) == 10
            closing_at = time.monotonic()
        assert time.monotonic() - closing_at < 2.0


async def test_a_publish_to_a_broker_that_never_answers_ends_within_the_publish_timeout(
) -> None:
    """A host that accepts connections and stays silent: the producer's start (topic
    check, bootstrap) would wait aiokafka's 40 s request timeout. The deadline covers
    it: nothing was sent, and the client closes at once."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = kafka_config(f"127.0.0.1:{port}", "silent", kafka={"publish_timeout_ms": 1000})
    try:
        started = time.monotonic()
        async with Client.from_config(config) as client:
            with pytest.raises(BrokerConnectionError, match="nothing was sent") as raised:
                await client.publish("orders", "k", {"seq": 1})
            assert not isinstance(raised.value, PublishUncertain)
            assert time.monotonic() - started < 1.0 + SLACK_S
        assert time.monotonic() - started < 2 * (1.0 + SLACK_S)
        assert held, "the client never connected"
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_an_outage_under_a_publish_logs_the_producers_retries_once_not_every_100_ms(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's sender logs a warning at each failed produce request, retried every
    ``retry_backoff_ms`` (100 ms): 30 a second while the broker is down. One line of
    each kind passes every 30 s, with how many more there were, as its client's
    "Unable connect" lines do."""
    sender = logging.getLogger("aiokafka.producer.sender")
    # At WARNING whatever an earlier test of this process set (the CLI, run in-process,
    # sets aiokafka's logger to CRITICAL).
    caplog.set_level(logging.WARNING, logger=sender.name)
    logged: list[str] = []  # every warning the sender logs, before any filter

    def every(record: logging.LogRecord) -> bool:
        logged.append(record.getMessage())
        return True

    sender.filters.insert(0, every)
    try:
        async with (behind_a_proxy(tmp_path, 3000) as (config, proxy),
                    Client.from_config(config) as client):
            await client.publish("orders", "warm", {"seq": -1})
            await proxy.cut()
            caplog.clear()
            logged.clear()
            with pytest.raises(PublishUncertain):
                await client.publish_batch([Publish("orders", "k", {"seq": i})
                                            for i in range(10)])
    finally:
        sender.removeFilter(every)
    assert len(logged) >= 10, f"the producer retried {len(logged)} times: nothing to test"
    # A line of the kind an earlier test of this process let pass is held for 30 s.
    lines = Counter(r.getMessage() for r in caplog.records
                    if r.name.startswith("aiokafka") and r.levelno >= logging.WARNING)
    assert max(lines.values(), default=0) <= 1, lines.most_common(3)
