"""The port's shape: dead letters and consumer groups are facets of the adapter.

Each is an object of its own (``adapter.dead_letters``, ``adapter.groups``), not the
adapter under another name, and the adapter no longer answers the old wide port's
methods (removed in issue 23, not aliased): an adapter written against the old port
fails here, loudly, rather than half-working.
"""

from __future__ import annotations

from conveyor.platform.adapter import ConsumerGroups, DeadLetters, QueueAdapter

OLD_METHODS = (
    "dead_letter", "read_dead_letters", "list_dead_letters", "find_dead_letter",
    "count_dead_letters", "delete_dead_letters", "replay_dead_letters",
    "has_group", "require_group", "delete_group", "retention_follows_groups",
)


async def test_dead_letters_and_groups_are_facets_of_their_own(adapter: QueueAdapter) -> None:
    assert isinstance(adapter.dead_letters, DeadLetters)
    assert isinstance(adapter.groups, ConsumerGroups)
    assert id(adapter) not in (id(adapter.dead_letters), id(adapter.groups))
    assert [name for name in OLD_METHODS if hasattr(adapter, name)] == []

