"""Topic drift on Kafka (real tansu, `conveyor worker` processes): a topic with more
partitions than ``queues.total`` is refused like one with fewer, and a topic deleted
under a running worker stops it with one line; a worker started then reads the new topic
from its start."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

import conveyor.adapters.kafka.receiver as receiver_module
from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.aiokafka_internals import fetch_committed
from conveyor.client import Client, Publish
from conveyor.platform.config import load_config
from conveyor.platform.errors import ConfigError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import DeadLetter, Message
from tests.conftest import stop_when, wait_until, wait_until_sync
from tests.integration.kafka.conftest import Tansu

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[3]
QUEUES = 4


def config_file(tansu: Tansu, topic: str, where: Path, total: int = QUEUES) -> Path:
    """configs/kafka.toml (kafka-group) pointed at the test broker and topic."""
    text = ((REPO / "configs" / "kafka.toml").read_text()
            .replace('bootstrap = "127.0.0.1:9092"', f'bootstrap = "{tansu.bootstrap}"')
            .replace('topic = "conveyor"', f'topic = "{topic}"')
            .replace("total = 8 ", f"total = {total} "))
    path = where / f"kafka-{total}.toml"
    path.write_text(text)
    return path


def worker(config: Path, out: Path, app: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_APP": app}
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "--log-level", "warning", "worker",
         "tests/apps/kafka_app.py:app", "--config", str(config)],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


async def publish(config: Path, tag: str, n: int) -> list[str]:
    """``n`` messages over 12 keys; their ids, as the app writes them."""
    async with Client.from_config(load_config(config, environ={})) as client:
        await client.publish_batch([
            Publish("jobs", f"k{i % 12}", {"id": f"{tag}-{i}", "k": f"k{i % 12}", "seq": i})
            for i in range(n)])
    return [f"{tag}-{i}" for i in range(n)]


def handled_ids(out: Path) -> list[str]:
    return [line.split()[0] for line in out.read_text().splitlines()] if out.exists() else []


def exited(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int | None, str]:
    """Its exit status and stderr once it exits by itself within ``timeout_s`` (None: it
    did not, and was killed)."""
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        proc.kill()
        return None, proc.communicate()[1]


async def test_a_topic_with_more_partitions_than_queues_is_refused_at_start(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    wider = KafkaAdapter(load_config(config_file(tansu, topic, tmp_path, 6), environ={}).kafka,
                         6)
    try:
        await wider.ensure_topic()  # the topic, with 6 partitions
    finally:
        await wider.close()
    config = config_file(tansu, topic, tmp_path)
    status, stderr = exited(worker(config, tmp_path / "out.txt", f"drift-{topic}"), 30)
    assert status == 2, stderr
    assert stderr.splitlines()[-1] == (
        f"conveyor: error: config: kafka topic {topic!r} has 6 partitions but $.queues.total "
        f"is {QUEUES}: partitions {QUEUES}-5 would never be read; set $.queues.total = 6"
    ), stderr
    with pytest.raises(ConfigError, match="has 6 partitions"):  # a producer is refused too
        await publish(config, "refused", 1)


async def test_a_compacted_topic_is_refused_at_start_and_to_a_producer(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    # Compaction keeps the last record of each key, a stream's key: the stream's earlier
    # messages would be deleted, handled or not. It was accepted without a word.
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, QUEUES, 1, topic_configs={
            "cleanup.policy": "compact"})])
    finally:
        await admin.close()
    config = config_file(tansu, topic, tmp_path)
    status, stderr = exited(worker(config, tmp_path / "out.txt", f"compact-{topic}"), 30)
    assert status == 2, stderr
    assert stderr.splitlines()[-1].startswith(
        f"conveyor: error: config: kafka topic {topic!r} has cleanup.policy=compact: "
        "compaction keeps only the last record of each stream key"), stderr
    with pytest.raises(ConfigError, match=r"cleanup\.policy=delete"):  # a producer too
        await publish(config, "refused", 1)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=30)


COMPACTED_LETTER_TOPICS = {
    "conveyor-dlq": "(dead letters) has cleanup.policy=compact: compaction keeps only the "
                    "last letter of each stream key, deleting the others before anyone read, "
                    "replayed or purged them",
    "conveyor-dlq-ops": "(what dlq replay and purge did) has cleanup.policy=compact: "
                        "compaction keeps only each app's last record, so purged and replayed "
                        "letters would be listed, and replayed, again",
}


async def create_compacted(tansu: Tansu, name: str) -> None:
    """Topic ``name``, one partition, ``cleanup.policy=compact``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs={
            "cleanup.policy": "compact"})])
    finally:
        await admin.close()


def compacted_line(name: str) -> str:
    """What is said of letter topic ``name`` compacted (``TOPIC.conveyor-dlq[-ops]``)."""
    suffix = name.rpartition(".")[2]
    return (f"kafka topic {name!r} {COMPACTED_LETTER_TOPICS[suffix]}; set "
            "cleanup.policy=delete (kafka-configs --alter --entity-type topics "
            f"--entity-name {name} --add-config cleanup.policy=delete)")


@pytest.mark.parametrize("suffix", sorted(COMPACTED_LETTER_TOPICS))
async def test_a_compacted_dead_letter_topic_is_refused_at_start_and_reported_by_status(
    tansu: Tansu, topic: str, tmp_path: Path, suffix: str
) -> None:
    # Only the queues' topic was checked: letters (key = stream key) and the record of
    # purges and replays (key = app) were compacted away without a word. The hand-off and
    # members topics are compacted by design (test_kafka_handoff.py): not refused.
    compacted = f"{topic}.{suffix}"
    await create_compacted(tansu, compacted)
    line = compacted_line(compacted)
    config = config_file(tansu, topic, tmp_path)
    app = f"compact-{topic}"
    status, stderr = exited(worker(config, tmp_path / "out.txt", app), 30)
    assert (status, stderr.splitlines()[-1:]) == (2, [f"conveyor: error: config: {line}"]), (
        stderr)
    assert len(await publish(config, "kept", 3)) == 3  # a producer writes no letters
    # `status` without --app: no app has a group yet (its worker was refused), and the
    # check ran only for the apps found; the topics are every app's, so it warns anyway.
    for args in (["status", "--app", app], ["status"], ["dlq", "list", "--app", app]):
        result = await asyncio.to_thread(cli, *args, "--config", str(config))
        assert result.returncode == 0, (args, result.stderr)
        assert [w for w in result.stderr.splitlines() if "cleanup.policy" in w] == [
            f"conveyor: warning: {line}"], (args, result.stderr)
    adapter = KafkaAdapter(load_config(config, environ={}).kafka, QUEUES)
    try:  # a letter stored before the topic was compacted, say
        await adapter.dead_letters.put(app, [DeadLetter.of(
            Message("m", StreamId("jobs", "k"), b"{}", token=SequenceToken(0, 0)), "h",
            ValueError("e"), 1)])
    except ConfigError as exc:  # refused, where compaction would delete it
        assert (suffix, str(exc)) == ("conveyor-dlq", line)
    finally:
        await adapter.close()
    purged = await asyncio.to_thread(cli, "dlq", "purge", "--all", "--yes", "--app", app,
                                     "--config", str(config))
    if suffix == "conveyor-dlq-ops":
        assert (purged.returncode, purged.stderr.splitlines()[-1:]) == (
            2, [f"conveyor: error: config: {line}"]), purged.stderr
    else:  # warned of, with the app that never ran (its worker was refused)
        assert (purged.returncode, purged.stderr.splitlines()) == (0, [
            f"conveyor: warning: {line}",
            f"conveyor: warning: --app {app!r} has no dead letters and no consumer group "
            "on any queue (a typo, or an app that never ran; groups here: none)"]), (
            purged.stderr)


async def test_the_commands_that_list_groups_refuse_a_topic_whose_partitions_differ(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """As a worker's start does, in one line and at once: with a smaller total, a group
    that read only the partitions past it would go unlisted ("no app on these queues");
    with a larger one, the partitions that do not exist have no end to read (aiokafka
    gives up after 40 s)."""
    adapter = KafkaAdapter(load_config(config_file(tansu, topic, tmp_path), environ={}).kafka,
                           QUEUES)
    try:
        await adapter.ensure_topic()  # the topic, with QUEUES partitions
        consumer = adapter.cluster.new_consumer("shop")
        await consumer.start()
        try:  # app "shop" has read partition 3 alone
            past = TopicPartition(topic, QUEUES - 1)
            consumer.assign([past])
            await consumer.commit({past: OffsetAndMetadata(0, "")})
        finally:
            await consumer.stop()
    finally:
        await adapter.close()
    lines = {
        2: f"conveyor: error: config: kafka topic {topic!r} has {QUEUES} partitions but "
           f"$.queues.total is 2: partitions 2-{QUEUES - 1} would never be read; set "
           f"$.queues.total = {QUEUES}",
        8: f"conveyor: error: config: kafka topic {topic!r} has {QUEUES} partitions but "
           "$.queues.total is 8; add partitions or lower it",
    }
    for total, line in lines.items():
        config = str(config_file(tansu, topic, tmp_path, total))
        for args in (["status"], ["status", "--app", "shop"], ["groups", "list"]):
            result = await asyncio.to_thread(cli, *args, "--config", config)
            assert (result.returncode, result.stderr.splitlines()[-1:]) == (2, [line]), (
                total, args, result.stdout, result.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("recreated", [False, True], ids=["deleted", "deleted-and-recreated"])
async def test_a_topic_deleted_under_a_running_worker_stops_it_and_a_new_worker_reads_the_new_one(
    tansu: Tansu, topic: str, tmp_path: Path, recreated: bool
) -> None:
    config = config_file(tansu, topic, tmp_path)
    app = f"drift-{topic}"
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    first = worker(config, first_out, app)
    try:
        before = await publish(config, "old", 40)
        await asyncio.to_thread(wait_until_sync, lambda: len(handled_ids(first_out)) == 40,
                                30, "the first 40 handled")
        admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
        await admin.start()
        try:
            # Deleted once the 40 are committed: a commit still in flight when the topic
            # is re-created lands on the new one (commits name the topic, not its id) and
            # skips its first records — the window docs/kafka.md names. (Under a loaded
            # CI run it did, and the new worker handled nothing.)
            async def all_committed() -> bool:
                offsets = await admin.list_consumer_group_offsets(
                    app, partitions=[TopicPartition(topic, q) for q in range(QUEUES)])
                return sum(o.offset for o in offsets.values() if o.offset > 0) == 40

            await wait_until(all_committed, 30, 0.1, "the first 40 committed")
            await admin.delete_topics([topic])
            if recreated:  # at once, as empty as a new topic
                await admin.create_topics([NewTopic(topic, QUEUES, 1)])
        finally:
            await admin.close()
    finally:
        status, stderr = await asyncio.to_thread(exited, first, 30)
    assert status == 1, stderr
    assert stderr.splitlines()[-1].startswith(
        f"conveyor: error: kafka topic {topic!r} was deleted or re-created under this worker "
        "(partition "), stderr
    assert sorted(handled_ids(first_out)) == sorted(before)
    after = await publish(config, "new", 40)  # 40 records in the new topic (created if absent)
    # 60 s: locally the new worker takes some 5 s, but it joins the group the failed one
    # left (tansu holds a member until its session times out) and starts a process,
    # which a CI run of both parallel workers once held past 30 s.
    await asyncio.to_thread(stop_when, worker(config, second_out, app),
                            lambda: len(handled_ids(second_out)) >= 40, 60,
                            "the new topic's 40 handled by a new worker")
    # Each record of the new topic exactly once (nothing committed from the old topic's
    # offsets skips any), and none of the old topic's again: no duplicate is allowed.
    assert sorted(handled_ids(second_out)) == sorted(after)


@pytest.mark.slow
async def test_a_group_offset_committed_past_the_partitions_end_is_read_from_its_start(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """What a broker restarted without its data leaves (tansu's memory storage: the old
    workers' commits, retried by aiokafka, land on the topic created anew), and a commit
    that landed on a re-created topic: the group's committed offsets past each
    partition's end. A worker started on it took that for a topic re-created under
    itself: it exited 1, handling nothing, and so did every worker started after it (run
    by hand: two workers, tansu restarted under them; 480 of the 1,000 messages published
    after the restart never handled). It reads each such partition from its start, and
    says so."""
    config = config_file(tansu, topic, tmp_path)
    app = f"drift-{topic}"
    after = await publish(config, "new", 40)  # creates the topic: about 10 a partition
    partitions = [TopicPartition(topic, q) for q in range(QUEUES)]
    stale = AIOKafkaConsumer(bootstrap_servers=tansu.bootstrap, group_id=app,
                             enable_auto_commit=False)
    await stale.start()
    try:
        stale.assign(partitions)
        await stale.commit({tp: OffsetAndMetadata(1000, "") for tp in partitions})
    finally:
        await stale.stop()
    out = tmp_path / "out.txt"
    stderr = await asyncio.to_thread(stop_when, worker(config, out, app),
                                     lambda: len(handled_ids(out)) >= 40, 60,
                                     "the 40 handled")
    assert sorted(handled_ids(out)) == sorted(after)  # each once
    assert "re-created under this worker" not in stderr, stderr
    assert stderr.count("committed offset 1000 is past the partition's end") == QUEUES, stderr


async def _three_read(tansu: Tansu, topic: str) -> tuple[KafkaAdapter, Any, list[Message]]:
    """An adapter of one queue, its receiver, and the three messages it read."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": 1},
        "kafka": {"bootstrap": tansu.bootstrap, "topic": topic, "idempotence": "off"}})
    adapter = KafkaAdapter(config.kafka, 1)
    receiver = adapter.create_receiver(0, "drift")
    async with Client.from_config(config) as client:
        await client.publish_batch([Publish("jobs", "k", {"seq": i}) for i in range(3)])
    await receiver.initialize()
    got = await receiver.get_messages(10, 2.0)
    assert len(got) == 3
    return adapter, receiver, got


async def _delete_topic(tansu: Tansu, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def test_a_receiver_outside_a_group_balancer_logs_a_deleted_topic_once_and_commits_no_more(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the static and dynamic balancers nobody fails the daemon: the adapter says it
    in one ERROR line, and no receiver reads or commits an old position from then on."""
    adapter, receiver, got = await _three_read(tansu, topic)
    try:
        await receiver.acknowledge([m.token for m in got])
        await _delete_topic(tansu, topic)
        for _ in range(5):  # pulls that find the partition ended before offset 3
            assert await receiver.get_messages(10, 0.2) == []
        assert adapter.topic_changed is not None
        # From then on a pull finds nothing after the poll's wait, letting the event loop
        # run: returned at once, the agent's pull loop held the loop until its ownership
        # lapsed (a 4.7 s stall of every other task, heartbeats included).
        others_ran = 0

        async def other_task() -> None:
            nonlocal others_ran
            while True:
                others_ran += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_task())
        try:
            for _ in range(20):
                assert await receiver.get_messages(10, 0.01) == []
        finally:
            other.cancel()
        assert others_ran >= 20
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == [str(adapter.topic_changed)]
        assert "(partition 0 ends at offset 0, before offset 3 it had reached)" in errors[0]
        await adapter.cluster.create_topics({topic: 1})  # the topic again, empty
        await receiver.acknowledge([m.token for m in got])  # commits nothing
        probe = adapter.cluster.new_consumer("drift")
        await probe.start()
        try:  # an old watermark committed here would skip the new topic's first 3 records
            assert await fetch_committed(probe, TopicPartition(topic, 0)) is None
        finally:
            await probe.stop()
    finally:
        await receiver.shutdown()
        await adapter.close()


async def test_a_commit_to_a_deleted_topic_is_bounded_and_names_the_topic_gone(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka retries a commit for a partition the broker does not know without end
    (an ERROR line every 100 ms): a topic deleted while its messages were in hand left the
    acknowledgement waiting for good, and a worker whose pulls did not see the partition
    end never stopped. The commit is bounded; past the bound the topic is looked up, and
    gone, it is said so and nothing more is committed."""
    monkeypatch.setattr(receiver_module, "COMMIT_WAIT_S", 1.0)
    adapter, receiver, got = await _three_read(tansu, topic)
    try:
        await _delete_topic(tansu, topic)
        async with asyncio.timeout(15):  # before: for good
            await receiver.acknowledge([m.token for m in got])
        assert adapter.topic_changed is not None
        assert "(partition 0 ends at offset 0, before offset 3 it had reached)" in str(
            adapter.topic_changed)
        errors = [r.getMessage() for r in caplog.records
                  if r.levelname == "ERROR" and r.name.startswith("conveyor")]
        assert errors == [str(adapter.topic_changed)]
    finally:
        await receiver.shutdown()
        await adapter.close()


async def test_the_console_checks_the_letter_topics_once_a_minute_not_per_app_and_poll(
    tansu: Tansu, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The compaction check opened an admin client and sent a DescribeConfigs per letter
    # topic for the apps' listing and again for each app's status, every poll: with three
    # apps, 4 of each per poll (of the poll's 23 admin clients, measured on tansu).
    from conveyor.console.poller import Poller

    compacted = f"{topic}.conveyor-dlq"
    await create_compacted(tansu, compacted)
    config = load_config(config_file(tansu, topic, tmp_path), environ={})
    adapter = KafkaAdapter(config.kafka, QUEUES)
    try:
        await adapter.ensure_topic()  # as a worker would (rewinding creates none)
        for app in ("a1", "a2", "a3"):  # three apps, each with a group
            await adapter.rewind_queues(range(QUEUES), app, 0.0, create_group=True)
    finally:
        await adapter.close()
    asked: list[str] = []
    describe = AIOKafkaAdminClient.describe_configs

    async def counted(self: AIOKafkaAdminClient, resources: Any, *rest: Any) -> Any:
        asked.extend(r.name for r in resources)
        return await describe(self, resources, *rest)

    monkeypatch.setattr(AIOKafkaAdminClient, "describe_configs", counted)
    poller = Poller(config, None)
    warned = []
    for _ in range(4):
        await poller.poll()
        warned.append([w for w in poller.reading.warnings if "cleanup.policy" in w])
    assert poller.reading.error is None
    assert [a.app for a in poller.reading.apps.apps] == ["a1", "a2", "a3"]
    assert asked.count(compacted) == 1, asked  # the first poll's look, not 4 x 4
    assert warned == [[compacted_line(compacted)]] * 4  # shown until the next look


async def test_a_broker_that_does_not_tell_a_letter_topic_s_policy_is_reported_not_logged_each_time(
    tansu: Tansu, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A broker that refuses DescribeConfigs (an ACL, an old broker): every check logged a
    # warning, so a running worker every minute and the console every poll.
    from aiokafka import errors as kerrors

    letters = f"{topic}.conveyor-dlq"
    config = load_config(config_file(tansu, topic, tmp_path), environ={})
    adapter = KafkaAdapter(config.kafka, QUEUES)
    try:
        await adapter.ensure_topic()
        await adapter.dead_letters.put("a1", [DeadLetter.of(
            Message("m", StreamId("jobs", "k"), b"{}", token=SequenceToken(0, 0)), "h",
            ValueError("e"), 1)])

        async def refused(self: AIOKafkaAdminClient, *args: Any) -> Any:
            raise kerrors.TopicAuthorizationFailedError("DescribeConfigs refused")

        monkeypatch.setattr(AIOKafkaAdminClient, "describe_configs", refused)
        with caplog.at_level(logging.WARNING, logger="conveyor.kafka"):
            for _ in range(3):  # a running worker's checks
                await adapter.recheck_server()
            problems = [await adapter.store_problems([], [], every_app=True)
                        for _ in range(2)]  # status, the console
    finally:
        await adapter.close()
    logged = [r.getMessage() for r in caplog.records if "cleanup.policy" in r.getMessage()]
    assert logged == [f"kafka: could not read the cleanup.policy of topic {letters!r} "
                      "([Error 29] TopicAuthorizationFailedError: DescribeConfigs refused); "
                      "a compacted topic deletes records before they are read"]
    assert [[(p.store, p.found) for p in found] for found in problems] == [
        [(letters, "cleanup.policy unknown")]] * 2
    assert problems[0][0].warning.startswith(
        f"kafka: could not read the cleanup.policy of topic {letters!r} "
        "(TopicAuthorizationFailedError: ")


async def test_partitions_added_under_a_running_worker_are_logged_at_every_look(
    tansu: Tansu, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Partitions added to the topic while workers run (``kafka-topics --alter
    --partitions``): the workers read only ``queues.total`` of them, and the records
    another producer (one hashing keys over every partition) writes to the new ones were
    read by no daemon without a word until a worker's next start refused the topic. A
    running worker looks again every minute (``SERVER_RECHECK_S``) and logs an error.
    tansu has no CreatePartitions (aiokafka: ``IncompatibleBrokerVersion``), so the topic
    is deleted and created again with two more: to the check, the same partition count."""
    config = load_config(config_file(tansu, topic, tmp_path), environ={})
    adapter = KafkaAdapter(config.kafka, QUEUES)
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        await adapter.ensure_topic()
        with caplog.at_level(logging.WARNING, logger="conveyor.kafka"):
            await adapter.recheck_server()  # nothing to say while they match
            assert [r.getMessage() for r in caplog.records] == []
            await admin.delete_topics([topic])
            await admin.create_topics([NewTopic(topic, QUEUES + 2, 1)])
            for _ in range(2):
                await adapter.recheck_server()
    finally:
        await admin.close()
        await adapter.close()
    line = (f"kafka topic {topic!r} has {QUEUES + 2} partitions but $.queues.total is "
            f"{QUEUES}: partitions {QUEUES}-{QUEUES + 1} would never be read; set "
            f"$.queues.total = {QUEUES + 2} (the topic changed under this running worker, "
            "which goes on with the partitions it has; a worker started under this config "
            "refuses the topic)")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("ERROR", line)] * 2


async def test_a_stale_commit_reset_by_the_fetch_itself_is_read_from_the_start(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A group offset committed past the partition's end (a broker that lost records, a
    topic re-created) is read from the partition's start when the receiver's first fetch
    finds the partition ending before it. tansu answers that fetch with no records;
    Apache Kafka answers OFFSET_OUT_OF_RANGE, and aiokafka then resets the position to
    the log start (``auto_offset_reset='earliest'``) without a word: the receiver's first
    records came from below the offset it started at, with its watermark still the stale
    one, so it handled the partition, committed the stale offset again, and then took
    the topic for re-created under itself (exit 1; the next worker the same). That reset
    is made here by seeking back as aiokafka does."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": 1},
        "kafka": {"bootstrap": tansu.bootstrap, "topic": topic, "idempotence": "off"}})
    adapter = KafkaAdapter(config.kafka, 1)
    async with Client.from_config(config) as client:
        await client.publish_batch([Publish("jobs", "k", {"seq": i}) for i in range(3)])
    tp = TopicPartition(topic, 0)
    stale = AIOKafkaConsumer(bootstrap_servers=tansu.bootstrap, group_id="drift",
                             enable_auto_commit=False)
    await stale.start()
    try:
        stale.assign([tp])
        await stale.commit({tp: OffsetAndMetadata(1000, "")})
    finally:
        await stale.stop()
    receiver = adapter.create_receiver(0, "drift")
    got: list[Message] = []
    try:
        with caplog.at_level(logging.WARNING, logger="conveyor.kafka"):
            await receiver.initialize()
            receiver._consumer.seek(tp, 0)  # type: ignore[attr-defined]  # aiokafka's reset
            for _ in range(10):
                batch = await receiver.get_messages(10, 0.3)
                got += batch
                if batch:
                    await receiver.acknowledge([m.token for m in batch if m.token])
            assert adapter.topic_changed is None, adapter.topic_changed
            probe = adapter.cluster.new_consumer("drift")
            await probe.start()
            try:
                committed = await fetch_committed(probe, tp)
            finally:
                await probe.stop()
    finally:
        await receiver.shutdown()
        await adapter.close()
    assert [m.token.major for m in got if m.token] == [0, 1, 2]  # each once
    assert committed is not None and committed[0] == 3
    said = [r.getMessage() for r in caplog.records]
    assert [s for s in said if "committed offset 1000 is past the partition's end" in s] == [
        said[0]], said
