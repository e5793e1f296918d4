"""Joining the Kafka group coordinator's members to the daemons' own reports."""

from __future__ import annotations

from conveyor.adapters.kafka.members import Described, MemberReport, join

NOW = 1_000.0
UUID = "d6a9214d-8538-4432-95c3-25ba6142eef2"


def report(member: str, queues: list[int], at: float = NOW) -> MemberReport:
    return MemberReport(member, "host-a", 42, 1.0, queues, {"handled": 7.0}, at)


def test_a_listed_member_is_matched_to_its_report_through_the_coordinators_suffix() -> None:
    # tansu: member id = our client id + "-" + a UUID (dashes of its own), nothing else.
    reports = {"shop-vm-1-aa": report("shop-vm-1-aa", [0, 2])}
    [member] = join([Described(f"shop-vm-1-aa-{UUID}", "", "", None)], reports, NOW, 10)
    assert (member.info.id, member.info.pid, member.queues) == ("shop-vm-1-aa", 42, [0, 2])
    assert member.info.stats == {"handled": 7.0}


def test_the_coordinators_assignment_wins_over_a_report() -> None:
    reports = {"shop-vm-1-aa": report("shop-vm-1-aa", [0, 2])}
    [member] = join([Described(f"shop-vm-1-aa-{UUID}", "shop-vm-1-aa", "10.0.0.9", [3, 1])],
                    reports, NOW, 10)
    assert member.queues == [1, 3]


def test_a_report_of_a_member_the_group_no_longer_lists_is_dropped() -> None:
    reports = {"gone": report("gone", [1]), "live": report("live", [0])}
    found = join([Described(f"live-{UUID}", "live", "", None)], reports, NOW, 10)
    assert [m.info.id for m in found] == ["live"]


def test_a_listed_member_without_a_report_shows_what_the_coordinator_knows() -> None:
    [member] = join([Described(f"other-{UUID}", "other", "10.0.0.9", [4])], {}, NOW, 10)
    assert (member.info.id, member.info.host, member.info.pid, member.queues) == (
        "other", "10.0.0.9", 0, [4])


def test_without_the_coordinator_only_fresh_reports_count() -> None:
    reports = {"fresh": report("fresh", [0], at=NOW - 5),
               "stale": report("stale", [1], at=NOW - 11)}
    assert [m.info.id for m in join(None, reports, NOW, 10)] == ["fresh"]
