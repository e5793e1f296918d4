"""The key layout under ``[redis] mode = "cluster"``: every script's keys in one slot.

Slots are computed with redis-py's own ``key_slot`` (CRC16 of the hash tag, as the
server does); the live cluster tests (tests/integration/redis_cluster) run the scripts.
"""

from __future__ import annotations

from redis.crc import key_slot

from conveyor.adapters.redis.keys import Keys


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_a_queues_stream_lease_fence_refused_acks_and_markers_share_its_slot() -> None:
    keys = Keys("conveyor", cluster=True)
    for queue in range(64):
        together = [keys.queue(queue), keys.lease("shop", queue), keys.fence("shop", queue),
                    keys.fenced_acks("shop", queue), keys.published(queue, "b1"),
                    keys.replayed("shop", queue, "1-0")]
        assert {slot(k) for k in together} == {slot(keys.queue(queue))}, together


def test_a_stored_batch_of_dead_letters_marks_it_in_the_letters_slot() -> None:
    keys = Keys("conveyor", cluster=True)
    assert slot(keys.letters_stored("shop", "b1")) == slot(keys.dead_letters("shop"))


def test_an_apps_membership_keys_share_one_slot() -> None:
    keys = Keys("conveyor", cluster=True)
    for app in ("shop", "billing", "a.b-c_d"):
        assert len({slot(keys.members(app)), slot(keys.member_info(app)),
                    slot(keys.members_version(app))}) == 1


def test_queues_spread_over_the_slots_of_a_three_primary_cluster() -> None:
    # redis-cli --cluster create, and tests/servers/cluster.py like it, splits 16384
    # slots in three even ranges.
    keys = Keys("conveyor", cluster=True)
    per_primary = [0, 0, 0]
    for queue in range(64):
        per_primary[min(slot(keys.queue(queue)) * 3 // 16384, 2)] += 1
    assert min(per_primary) >= 12, per_primary


def test_standalone_keeps_the_original_names() -> None:
    keys = Keys("conveyor")
    assert keys.lease("shop", 3) == "conveyor:app:shop:lease:3"
    assert keys.fence("shop", 3) == "conveyor:app:shop:fence:3"
    assert keys.fenced_acks("shop", 3) == "conveyor:app:shop:fenced-acks"
    assert keys.members("shop") == "conveyor:app:shop:members"
    assert keys.members_version("shop") == "conveyor:app:shop:members-version"
    assert keys.queue(3) == "conveyor:q:3"


def test_every_app_key_still_starts_with_the_apps_name_for_groups_delete() -> None:
    keys = Keys("conveyor", cluster=True)
    app = keys.app("shop") + ":"
    for key in (keys.lease("shop", 1), keys.fence("shop", 1), keys.fenced_acks("shop", 1),
                keys.members("shop"), keys.member_info("shop"), keys.members_version("shop"),
                keys.leases_generation("shop")):
        assert key.startswith(app), key
