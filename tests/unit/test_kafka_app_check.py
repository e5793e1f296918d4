"""The app identity a kafka-group daemon puts in front of its assignor's user data
(conveyor/adapters/kafka/app_check.py): the assignor gets its own bytes back, members
without one are passed through, and each other app is told once."""

from __future__ import annotations

import logging

import pytest
from aiokafka.cluster import ClusterMetadata

from conveyor.adapters.kafka.aiokafka_internals import (
    ConsumerProtocolMemberMetadata,
    sticky_assignor,
)
from conveyor.adapters.kafka.app_check import (
    AppCheck,
    AppIdentity,
    checking_assignor,
    seal,
    unseal,
)


def test_the_assignors_own_user_data_comes_back_whole() -> None:
    assert unseal(seal(b"{}", b"sticky-bytes")) == (b"{}", b"sticky-bytes")
    assert unseal(seal(b"{}", None)) == (b"{}", b"")
    assert unseal(b"sticky-bytes") == (None, b"sticky-bytes")
    assert unseal(None) == (None, b"")


def test_the_leader_passes_every_identity_to_each_member_and_the_assignor_its_bytes(
) -> None:
    seen: list[list[AppIdentity]] = []
    me = AppIdentity("shop-a", "h1", ["on_orders"], ["orders"])
    assignor = checking_assignor(sticky_assignor(), me, seen.append)
    ours = assignor.metadata(["t"])
    assert ours.subscription == ["t"]
    older = ConsumerProtocolMemberMetadata(1, ["t"], b"")  # a Conveyor without the check
    cluster = ClusterMetadata()
    out = assignor.assign(cluster, {"a": ours, "b": older})
    assert set(out) == {"a", "b"}
    assignor.on_assignment(out["b"])
    assert seen == [[me]]


def test_another_app_is_told_once_and_its_twin_daemons_not_at_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    me = AppIdentity("shop-a", "h1", ["on_orders"], ["orders"])
    twin = AppIdentity("shop-b", "h2", ["on_orders"], ["orders"])
    other = AppIdentity("shop-c", "h3", ["on_payments"], ["payments"])
    check = AppCheck("shop", me)
    with caplog.at_level(logging.WARNING, logger="conveyor.kafka_group"):
        for _ in range(3):
            check.seen([me, twin, other])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith("group 'shop' (the app's name) also has member shop-c on h3 "
                              "whose handlers ['on_payments'] (namespaces ['payments']) "
                              "are not this daemon's ['on_orders'] (namespaces ['orders'])")
