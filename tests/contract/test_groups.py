"""Consumer groups, for operators (``conveyor status``, ``groups list``, ``groups
delete``, rewind's group check): listed with their lag, never created by reading,
deleted one at a time; the same on every adapter.

Every test gives its groups a position by acknowledging something: Redis and the memory
broker create a group when a receiver opens, Kafka (``new_group_start = "earliest"``) at
its first commit.

What only one backend does stays with it: the CLI's refusals and trimming resuming on
Redis (tests/integration/redis/test_redis_groups.py), a Kafka group that also reads
another topic (tests/integration/kafka/test_kafka_groups.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.errors import ConfigError, UnknownGroupError
from conveyor.platform.operations.groups import GroupInfo
from tests.contract.conftest import Open
from tests.contract.support import numbered, take, tokens
from tests.contract.test_dead_letters import letter


@dataclass(frozen=True)
class Apps:
    """Group names of the test's own: Kafka groups span topics, and the contract tests
    of a module share one broker, so ``ahead`` of one test would be ``ahead`` of the
    next (and deleting it would be refused for its offsets on the other topic)."""

    ahead: str
    behind: str

    def rows(self, infos: list[GroupInfo]) -> list[tuple[int, str, int]]:
        """(queue, group, lag) of each row, in the adapter's order, the names without
        their suffix."""
        short = {self.ahead: "ahead", self.behind: "behind"}
        return [(i.queue, short.get(i.group, i.group), i.lag) for i in infos]


@pytest.fixture
def apps() -> Apps:
    suffix = uuid.uuid4().hex[:6]
    return Apps(f"ahead-{suffix}", f"behind-{suffix}")


def known_to_fail_on(name: str, adapter: QueueAdapter, request: pytest.FixtureRequest,
                     reason: str) -> None:
    """Mark this test a strict xfail on adapter ``name``: it must fail there, for
    ``reason``, until that is fixed (then the xfail is removed)."""
    if adapter.name == name:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


async def two_groups(adapter: QueueAdapter, open_receiver: Open, apps: Apps) -> None:
    """Six messages on queue 0, four on queue 1, and two apps that nobody runs now:

    * ``ahead`` took the six of queue 0 and acknowledged two, and finished queue 1;
    * ``behind`` took and acknowledged one message of each queue.
    """
    await adapter.enqueue(0, numbered(range(6)))
    await adapter.enqueue(1, numbered(range(4)))
    for app, queue, taken, acked in ((apps.ahead, 0, 6, 2), (apps.ahead, 1, 4, 4),
                                     (apps.behind, 0, 1, 1), (apps.behind, 1, 1, 1)):
        receiver = await open_receiver(queue, app)
        got = await take(receiver, taken)
        await receiver.acknowledge(tokens(got[:acked]))
        await receiver.shutdown()


BOTH = [(0, "ahead", 4), (0, "behind", 5), (1, "ahead", 0), (1, "behind", 3)]
"""Every (queue, group, lag) row of :func:`two_groups`: what was delivered and not
acknowledged counts."""


async def test_groups_lists_every_group_on_each_queue_with_what_it_has_not_finished(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    listed = await adapter.groups.on([0, 1])
    assert [i.queue for i in listed] == sorted(i.queue for i in listed), "ordered by queue"
    assert sorted(apps.rows(listed)) == BOTH
    assert sorted(apps.rows(await adapter.groups.on([1]))) == BOTH[2:]
    assert await adapter.groups.has([1], apps.behind)


async def test_every_group_on_a_queue_tells_how_many_messages_it_was_ever_given(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    """The queue's end position, whatever each group read of it (the console's in/s)."""
    await two_groups(adapter, open_receiver, apps)
    await adapter.enqueue(1, numbered(range(4, 7)))  # more arrives after the reads
    listed = await adapter.groups.on([0, 1])
    assert sorted((i.queue, i.appended) for i in listed) == [(0, 6), (0, 6), (1, 7), (1, 7)]


async def test_a_group_is_listed_only_on_the_queues_it_has_a_position_on(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps, request: pytest.FixtureRequest
) -> None:
    known_to_fail_on("kafka", adapter, request,
                     "bug: KafkaGroups.on lists a group on every queue asked for once it "
                     "committed on one (adapters/kafka/groups.py: lag = the whole partition "
                     "where it has no offset), while KafkaGroups.has says it has no "
                     "position there")
    await adapter.enqueue(0, numbered(range(3)))
    await adapter.enqueue(1, numbered(range(4)))
    receiver = await open_receiver(0, apps.ahead)
    await receiver.acknowledge(tokens(await take(receiver, 1)))
    await receiver.shutdown()
    assert not await adapter.groups.has([1], apps.ahead)
    assert apps.rows(await adapter.groups.on([0, 1])) == [(0, "ahead", 2)]


async def test_retention_is_held_by_the_group_needing_the_oldest_message_where_it_follows_groups(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    holders = {(i.queue, i.group) for i in await adapter.groups.on([0, 1]) if i.holds_retention}
    if adapter.groups.retention_follows_groups:
        assert holders == {(0, apps.behind), (1, apps.behind)}
    else:
        assert holders == set(), "retention goes by time or size: no group holds it"


async def test_reading_groups_creates_none(adapter: QueueAdapter) -> None:
    await adapter.enqueue(0, numbered(range(3)))
    assert await adapter.groups.on([0, 1]) == []
    assert not await adapter.groups.has([0, 1], "ghost")
    assert await adapter.lag(0, "ghost") == 3  # what a new group would have to read
    with pytest.raises(UnknownGroupError, match="ghost"):
        await adapter.groups.require([0, 1], "ghost")
    assert await adapter.groups.on([0, 1]) == []


async def test_deleting_a_group_removes_it_and_leaves_the_others(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    assert await adapter.groups.delete(apps.behind, [0, 1]) == [0, 1]
    assert sorted(apps.rows(await adapter.groups.on([0, 1]))) == [(0, "ahead", 4), (1, "ahead", 0)]
    assert not await adapter.groups.has([0, 1], apps.behind)
    with pytest.raises(UnknownGroupError):
        await adapter.groups.require([0, 1], apps.behind)
    assert await adapter.groups.delete(apps.ahead, [0, 1]) == [0, 1]
    assert await adapter.groups.on([0, 1]) == []


async def test_deleting_a_group_from_some_queues_leaves_it_on_the_others(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps, request: pytest.FixtureRequest
) -> None:
    known_to_fail_on("kafka", adapter, request,
                     "limitation: KafkaGroups.delete deletes the whole Kafka group "
                     "(DeleteGroups), on every partition, whatever queues it is given")
    await two_groups(adapter, open_receiver, apps)
    assert await adapter.groups.delete(apps.ahead, [1]) == [1]
    assert sorted(apps.rows(await adapter.groups.on([0, 1]))) == [
        (0, "ahead", 4), (0, "behind", 5), (1, "behind", 3)]


async def test_deleting_a_group_nobody_has_deletes_nothing(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    assert await adapter.groups.delete(f"ghost-{apps.ahead}", [0, 1]) == []
    assert sorted(apps.rows(await adapter.groups.on([0, 1]))) == BOTH


async def test_a_deleted_group_keeps_its_dead_letters_unless_they_are_asked_for(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    """With ``dead_letters`` the app's letters go too where the store is the app's own;
    a backend that keeps every app's letters in one place refuses (naming the option)
    before deleting anything."""
    await two_groups(adapter, open_receiver, apps)
    await adapter.dead_letters.put(apps.behind, [letter(1)])
    await adapter.dead_letters.put(apps.ahead, [letter(2)])
    assert await adapter.groups.delete(apps.behind, [0, 1]) == [0, 1]
    assert await adapter.dead_letters.count(apps.behind) == 1

    try:
        removed = await adapter.groups.delete(apps.ahead, [0, 1], dead_letters=True)
    except ConfigError as refused:
        assert "--with-dead-letters" in str(refused)
        assert await adapter.groups.has([0], apps.ahead), "a refused delete removed the group"
        assert await adapter.dead_letters.count(apps.ahead) == 1
    else:
        assert removed == [0, 1]
        assert await adapter.dead_letters.count(apps.ahead) == 0
    assert await adapter.dead_letters.count(apps.behind) == 1, "another app's letters went"


async def test_a_group_deleted_and_read_again_starts_as_a_new_group(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    await adapter.groups.delete(apps.ahead, [0, 1])
    again = await open_receiver(0, apps.ahead)
    assert len(await take(again, 6)) == 6, "the old position (2 acknowledged) was kept"


async def test_rewinding_an_app_with_no_group_is_refused_and_creates_one_only_when_asked(
    adapter: QueueAdapter, open_receiver: Open, apps: Apps
) -> None:
    await two_groups(adapter, open_receiver, apps)
    ghost = f"ghost-{apps.ahead}"
    with pytest.raises(UnknownGroupError, match="create_group"):
        await adapter.rewind_queues([0, 1], ghost, 0.0)
    assert not await adapter.groups.has([0, 1], ghost)
    assert sorted(apps.rows(await adapter.groups.on([0, 1]))) == BOTH
    await adapter.rewind_queues([0, 1], ghost, 0.0, create_group=True)
    assert {(i.queue, i.lag) for i in await adapter.groups.on([0, 1]) if i.group == ghost} == {
        (0, 6), (1, 4)}
    await adapter.rewind_queues([0], apps.ahead, 0.0)  # an app with a group needs no flag
