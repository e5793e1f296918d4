"""Reading a consumer-group member's assignment, as rewind's ownership check does
(pure logic: tansu reports no assignments, so no broker here can produce one)."""

from __future__ import annotations

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from conveyor.adapters.kafka.members import assigned_partitions


def test_a_members_assignment_names_the_partitions_it_holds_of_the_topic() -> None:
    raw = ConsumerProtocolMemberAssignment(0, [("orders", [0, 2]), ("other", [1])], b"").encode()
    assert assigned_partitions(raw, "orders") == {0, 2}
    assert assigned_partitions(raw, "other") == {1}
    assert assigned_partitions(raw, "absent") == set()


def test_an_assignment_that_cannot_be_read_holds_nothing() -> None:
    assert assigned_partitions(b"", "orders") == set()  # tansu
    assert assigned_partitions(None, "orders") == set()
    assert assigned_partitions(b"\x00\x01\xff", "orders") == set()  # not the consumer protocol
