"""Hostile records on the queues' topic, as an outside harness writes them: a raw aiokafka
producer (no Conveyor code) mixes them among good messages of one partition, and a real
``conveyor worker`` on the shipped configs/kafka.toml (kafka-group, 8 partitions) reads
them. Then ``conveyor dlq list``, ``show`` and ``replay`` as an operator runs them.

The promise: every good message handled once, as published; every record that is a
message by the wire format (docs/kafka.md) handled as it says; every other one a dead
letter whose reason names what was wrong; nothing left unacknowledged; the worker
never logs an error or a traceback and drains cleanly; a replay replays what it can
and refuses the rest, one line each. tests/integration/kafka/test_kafka_bad_input.py
has the cases that need an in-process daemon (header names that are not UTF-8).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from conveyor.client import Client
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.kafka.conftest import Tansu

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
APP = "hostile"
BIG = 1_500_000
"""Over the 1 MiB a Conveyor producer sends (its max_request_size): a raw one may."""


@dataclass(frozen=True)
class Hostile:
    """One record: ``headers`` after ``x-case`` (the name, to find it again); ``handled``:
    the (namespace, key) a handler gets it under, or None when it is a dead letter whose
    reason holds ``reason``."""

    name: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    handled: tuple[str, str] | None = None
    reason: str = ""
    error_type: str = "Undecodable"
    """``DecodeError``: a message whose body does not decode (replayable)."""
    timestamp_ms: int | None = None
    """The record's timestamp (None: the producer's clock; -1: none, Kafka's old format)."""


def conveyor_headers(*more: tuple[str, bytes | None]) -> tuple[tuple[str, bytes | None], ...]:
    return (("cv-ns", b"jobs"), ("cv-id", b"an-id"), *more)


def body_fault(name: str, value: bytes, reason: str, *more: tuple[str, bytes | None]
               ) -> Hostile:
    """A message of ``jobs`` whose body does not decode into the handler's dict."""
    return Hostile(name, b"g", value, conveyor_headers(*more), reason=reason,
                   error_type="DecodeError")


SEQ = b'{"seq": -1}'
CASES = [
    Hostile("tombstone", b"g", None, conveyor_headers(),
            reason="null value (a Kafka tombstone)"),
    Hostile("tombstone-foreign", b"g", None, (), reason="null value (a Kafka tombstone)"),
    Hostile("null-key", None, SEQ, conveyor_headers(), handled=("jobs", "")),
    Hostile("empty-key", b"", SEQ, conveyor_headers(), handled=("jobs", "")),
    body_fault("empty-value", b"", "cannot decode body as dict: the body is empty"),
    body_fault("bad-json", b'{"seq": ', "cannot decode body as dict: Input data was truncated"),
    body_fault("json-null", b"null", "cannot decode body as dict: Expected `object`, got `null`"),
    # Its letter was written with cv-ts=-1, read back undecodable: listed without its
    # stream, never replayed.
    Hostile("no-timestamp-bad-json", b"g", b"not json", conveyor_headers(),
            reason="cannot decode body as dict: JSON is malformed", error_type="DecodeError",
            timestamp_ms=-1),
    Hostile("no-timestamp", b"g", SEQ, conveyor_headers(), handled=("jobs", "g"),
            timestamp_ms=-1),
    # Its 900 kB key was printed whole by `dlq list`, folded over ~40,000 lines.
    Hostile("key-900kb-bad-json", b"k" * 900_000, b"not json", conveyor_headers(),
            reason="cannot decode body as dict: JSON is malformed", error_type="DecodeError"),
    Hostile("attempt-float", b"g", SEQ, conveyor_headers(("cv-attempt", b"1.5")),
            reason="cv-attempt is not a whole number from 0 to 2147483647: b'1.5'"),
    Hostile("attempt-negative", b"g", SEQ, conveyor_headers(("cv-attempt", b"-1")),
            reason="cv-attempt is not a whole number"),
    Hostile("ts-garbage", b"g", SEQ, conveyor_headers(("cv-ts", b"yesterday")),
            reason="cv-ts is not a whole number"),
    Hostile("ns-null", b"g", SEQ, (("cv-ns", None),), reason="cv-ns header is empty"),
    Hostile("ns-missing", b"g", SEQ, (("cv-id", b"an-id"),), handled=("default", "g")),
    Hostile("no-conveyor-headers", b"g", SEQ, (), handled=("default", "g")),  # a key only
    Hostile("content-type-unknown", b"g", SEQ,
            conveyor_headers(("content-type", b"application/x-weird")), handled=("jobs", "g")),
    body_fault("content-type-protobuf", b"\x08\x96\x01",
               "(read as JSON: its content type 'application/x-protobuf' is neither",
               ("content-type", b"application/x-protobuf")),
    body_fault("content-type-msgpack-json-body", b'{"seq": 1}',
               "(read as msgpack, its content type): Expected `object`, got `int`",
               ("content-type", b"application/msgpack")),
    Hostile("ns-twice", b"g", SEQ, conveyor_headers(("cv-ns", b"default")),
            reason="cv-ns given twice with different values (b'jobs', then b'default')"),
    Hostile("ns-twice-alike", b"g", SEQ, conveyor_headers(("cv-ns", b"jobs")),
            handled=("jobs", "g")),
    Hostile("attempt-twice", b"g", SEQ,
            conveyor_headers(("cv-attempt", b"1"), ("cv-attempt", b"2")),
            reason="cv-attempt given twice with different values"),
    Hostile("id-twice", b"g", SEQ, conveyor_headers(("cv-id", b"another")),
            reason="cv-id given twice with different values"),
    Hostile("headers-500", b"g", SEQ,
            conveyor_headers(*((f"x-h{i}", b"v" * 10) for i in range(500))),
            handled=("jobs", "g")),
    Hostile("value-null-header", b"g", SEQ, conveyor_headers(("x-null", None)),
            handled=("jobs", "g")),
    Hostile("big", b"g", b"x" * BIG,
            (("cv-ns", b"big"), ("content-type", b"application/octet-stream")),
            handled=("big", "g")),
    # Its letter cannot be stored in full either (the producer's 1 MiB): stored bare.
    Hostile("big-undecodable", b"g", b" " * BIG, conveyor_headers(("cv-attempt", b"x")),
            reason="cv-attempt is not a whole number"),
]


def config_file(tansu: Tansu, topic: str, where: Path) -> Path:
    """configs/kafka.toml as shipped, pointed at the test broker and topic."""
    text = ((REPO / "configs" / "kafka.toml").read_text()
            .replace('bootstrap = "127.0.0.1:9092"', f'bootstrap = "{tansu.bootstrap}"')
            .replace('topic = "conveyor"', f'topic = "{topic}"'))
    path = where / "kafka.toml"
    path.write_text(text)
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def handled_rows(out: Path) -> list[dict[str, Any]]:
    """What tests/apps/hostile_app.py wrote: one dict per handled message."""
    return [json.loads(line) for line in out.read_text().splitlines()] \
        if out.exists() else []


def run_worker(config: Path, out: Path, done: Callable[[], bool], what: str) -> str:
    """A ``conveyor worker`` of tests/apps/hostile_app.py until ``done()``, then SIGTERM
    (it must drain and exit 0); its stderr, which has no traceback."""
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_APP": APP}
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests/apps/hostile_app.py:app",
         "--config", str(config)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_sync(done, 60, what)
        assert worker.poll() is None, "the worker exited"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    stderr = worker.stderr.read() if worker.stderr else ""
    assert "Traceback" not in stderr and " ERROR " not in stderr, stderr
    return stderr


async def write_mixed(config_path: Path) -> tuple[list[int], dict[str, str]]:
    """A good message of stream jobs/g, then each case and another good one, all on g's
    partition; the good seqs, and each case's token (``QUEUE:OFFSET-0``)."""
    config = load_config(config_path, environ={})
    tokens: dict[str, str] = {}
    good: list[int] = []
    async with Client.from_config(config) as client:
        queue = client.queue_for("jobs", "g")
        producer = AIOKafkaProducer(bootstrap_servers=config.kafka.bootstrap,
                                    max_request_size=4 * BIG)
        await producer.start()
        try:
            for seq, case in enumerate([None, *CASES]):
                if case is not None:
                    headers = [("x-case", case.name.encode()), *case.headers]
                    sent: Any = await producer.send_and_wait(
                        config.kafka.topic, case.value, key=case.key, partition=queue,
                        headers=headers, timestamp_ms=case.timestamp_ms)
                    tokens[case.name] = f"{queue}:{sent.offset}-0"
                await client.publish("jobs", "g", {"seq": seq})
                good.append(seq)
        finally:
            await producer.stop()
    return good, tokens


def test_hostile_records_are_handled_or_dead_lettered_with_their_reason_by_a_cli_worker(
    tansu: Tansu, topic: str, tmp_path: Path,
) -> None:
    config = config_file(tansu, topic, tmp_path)
    good, tokens = asyncio.run(write_mixed(config))
    out = tmp_path / "handled.jsonl"
    lettered = [c for c in CASES if c.handled is None]

    def status_lag() -> int:
        status = cli("status", "--app", APP, "--json", "--config", str(config))
        return sum(q["lag"] for q in json.loads(status.stdout)["queues"]) \
            if status.returncode == 0 else -1

    stderr = run_worker(
        config, out, lambda: len(handled_rows(out)) >= len(good) + len(CASES) - len(lettered)
        and status_lag() == 0, "every good and readable record handled, lag 0")
    drained = [line for line in stderr.splitlines() if line.startswith("conveyor: drained")]
    assert drained and f"dead_lettered={len(lettered)} " in drained[-1], stderr

    rows = handled_rows(out)
    goods = sorted(r["body"]["seq"] for r in rows if r["case"] is None and r["ns"] == "jobs"
                   and r["key"] == "g")
    assert goods == good  # each once, as published
    by_case = {r["case"]: r for r in rows if r["case"] is not None}
    for case in CASES:
        if case.handled is not None:
            row = by_case[case.name]
            assert (row["ns"], row["key"]) == case.handled, case.name
            assert row["body"] == (BIG if case.name == "big" else {"seq": -1}), case.name
    assert by_case["headers-500"]["headers"] == 501  # x-case and the 500
    assert len(rows) == len(good) + len(CASES) - len(lettered)  # nothing more

    listed = cli("dlq", "list", "--app", APP, "--json", "--limit", "1000",
                 "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    letters = {x["token"]: x for x in json.loads(listed.stdout)}
    for wide in ((), ("--wide",)):  # a row a letter, whatever a producer's key
        table = cli("dlq", "list", "--app", APP, *wide, "--config", str(config))
        assert table.returncode == 0, table.stderr
        assert len(table.stdout.splitlines()) < 4 * len(lettered) + 10, table.stdout[:2000]
    assert sorted(letters) == sorted(tokens[c.name] for c in lettered)
    for case in lettered:
        letter = letters[tokens[case.name]]
        assert case.reason in letter["error"], (case.name, letter["error"])
        assert letter["error_type"] == case.error_type, case.name
        if case.error_type == "DecodeError":  # a message: its stream is known
            assert (letter["namespace"], letter["key"]) == ("jobs", case.key.decode()), \
                case.name
        shown = cli("dlq", "show", letter["id"], "--app", APP, "--config", str(config))
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert f"error:         {letter['error']}" in shown.stdout.splitlines(), case.name
    assert letters[tokens["big-undecodable"]]["form"] == "bare"

    replayed = cli("dlq", "replay", "--all", "--app", APP, "--config", str(config))
    assert replayed.returncode == 0, replayed.stderr
    assert "Traceback" not in replayed.stderr
    undecodable = [c for c in lettered if c.error_type == "Undecodable"]
    skipped = [line for line in replayed.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == len(undecodable), replayed.stderr
    assert all(line.startswith("conveyor: warning: skipped ") and line.endswith(
        "its message was undecodable (no namespace to route it by)") for line in skipped)
    assert replayed.stdout.splitlines()[-1] == (
        f"replayed {len(lettered) - len(undecodable)} letter(s) of app {APP!r}; "
        f"{len(undecodable)} skipped and kept")


def test_batches_other_producers_compressed_are_read_by_a_cli_worker(
    tansu: Tansu, topic: str, tmp_path: Path,
) -> None:
    # Java producers often compress (compression.type = lz4, snappy, zstd). Without
    # their libraries aiokafka cannot read such a batch: the partition stalled behind it,
    # its pull failing twice a second, and `conveyor status` failed reading its lag.
    from aiokafka.codec import has_lz4, has_snappy, has_zstd

    assert has_lz4() and has_snappy() and has_zstd(), (
        "aiokafka's codecs are missing: reinstall conveyor (its aiokafka extras "
        "lz4, snappy, zstd bring cramjam)")
    config = config_file(tansu, topic, tmp_path)
    codecs = ["gzip", "snappy", "lz4", "zstd"]

    async def write() -> list[tuple[str, int]]:
        written: list[tuple[str, int]] = []
        loaded = load_config(config, environ={})
        async with Client.from_config(loaded) as client:
            queue = client.queue_for("jobs", "g")
            for n, codec in enumerate(codecs):
                await client.publish("jobs", "g", {"seq": n})
                written.append(("good", n))
                producer = AIOKafkaProducer(bootstrap_servers=loaded.kafka.bootstrap,
                                            compression_type=codec, linger_ms=100)
                await producer.start()
                try:  # three records, one batch
                    sent = [await producer.send(loaded.kafka.topic, b'{"seq": %d}' % i,
                                                key=b"g", partition=queue,
                                                headers=[("cv-ns", b"jobs"),
                                                         ("x-case", codec.encode())])
                            for i in range(3)]
                    await asyncio.gather(*sent)
                finally:
                    await producer.stop()
                written += [(codec, i) for i in range(3)]
            await client.publish("jobs", "g", {"seq": len(codecs)})
            written.append(("good", len(codecs)))
        return written

    written = asyncio.run(write())
    out = tmp_path / "handled.jsonl"

    def handled() -> list[tuple[str, int]]:
        return [(r["case"] or "good", r["body"]["seq"]) for r in handled_rows(out)]

    stderr = run_worker(config, out, lambda: len(handled()) >= len(written),
                        "every record handled")
    assert "pull failed" not in stderr, stderr
    assert handled() == written  # in order: one stream, one partition
    status = cli("status", "--app", APP, "--json", "--config", str(config))
    assert status.returncode == 0, status.stderr
    assert sum(q["lag"] for q in json.loads(status.stdout)["queues"]) == 0


class _CorruptCrc:
    """A batch builder whose built batch has a wrong CRC (tansu stores it unchecked)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def build(self) -> bytes:
        built = bytearray(self._inner.build())
        built[17] ^= 0xFF  # the CRC's first byte: BaseOffset 8, Length 4, Epoch 4, Magic 1
        return bytes(built)


def test_status_reports_the_lag_of_a_queue_stuck_behind_a_batch_it_cannot_read(
    tansu: Tansu, topic: str, tmp_path: Path,
) -> None:
    # status measures lag from a fetch's high watermark; the fetch of a batch aiokafka
    # cannot parse (a wrong CRC here; a codec not installed too) raised, and `conveyor
    # status` of the whole app failed with "reading the lag of queue N failed".
    config = config_file(tansu, topic, tmp_path)

    async def write() -> int:
        async with Client.from_config(load_config(config, environ={})) as client:
            queue = client.queue_for("jobs", "g")
            await client.adapter.ensure_topic()  # type: ignore[attr-defined]
            producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
            await producer.start()
            try:
                batch = producer.create_batch()
                batch.append(timestamp=None, key=b"g", value=SEQ,
                             headers=[("cv-ns", b"jobs")])
                batch.close()
                batch._builder = _CorruptCrc(batch._builder)
                await (await producer.send_batch(batch, topic, partition=queue))
            finally:
                await producer.stop()
            await client.publish("jobs", "g", {"seq": 0})  # behind it
        return queue

    queue = asyncio.run(write())
    status = cli("status", "--app", APP, "--json", "--config", str(config))
    assert status.returncode == 0, status.stderr
    lags = {q["queue"]: q["lag"] for q in json.loads(status.stdout)["queues"]}
    assert lags == {q: 2 if q == queue else 0 for q in range(8)}
