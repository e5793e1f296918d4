"""Noticing another app in the consumer group (``kafka-group``): two apps run under one name.

The consumer group is named after the app, so two different apps that happen to share a
name on one topic (two teams each call theirs ``shop``) join one group: the coordinator
splits the topic's partitions between them, and each skips — acknowledges unhandled —
the other's messages on the partitions it holds. The other app never sees those.

What members exchange is the consumer protocol's JoinGroup metadata, which the group
leader alone reads, and the assignment it hands each member. So each daemon puts its
app's *handlers and namespaces* (and its member id and host) in front of its assignor's
``user_data``; the leader reads them all, hands the assignor its own bytes back, and
puts the list of every member's identity in front of each member's assignment's
``user_data``. Each daemon then compares: a member whose handlers or namespaces differ
from its own is logged, once per distinct set, as a warning naming both sides and the
fix (give each app its own name). Every daemon of both apps says so, the leader
included.

Decided, and what is not detected:

* The *app's code version* is not exchanged: daemons do not know it. Two apps with the
  very same handler names and namespaces look alike and are not told apart.
* A deploy that adds or removes a handler shows the same difference while old and new
  daemons overlap; the warning says that case ends when the old daemons stop.
* A member that sends no identity (a Conveyor older than this check, another client) is
  not compared. An older Conveyor *leader* running the sticky assignor cannot read the
  prefixed ``user_data`` and assigns once without stickiness (it logs it); round robin
  ignores ``user_data``.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from conveyor.adapters.kafka.aiokafka_internals import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

log = logging.getLogger("conveyor.kafka_group")

MAGIC = b"\x00conveyor-app\x00"
_LENGTH = struct.Struct(">I")


class AppIdentity(msgspec.Struct, frozen=True):
    """What a member says of its app in the group's JoinGroup metadata."""

    member: str
    host: str
    handlers: list[str]
    namespaces: list[str]

    def shape(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(sorted(self.handlers)), tuple(sorted(self.namespaces))


_encode = msgspec.json.Encoder().encode
_decode_one = msgspec.json.Decoder(AppIdentity).decode
_decode_all = msgspec.json.Decoder(list[AppIdentity]).decode


def seal(payload: bytes, rest: bytes | None) -> bytes:
    """``payload`` in front of the assignor's own ``rest`` of the user data."""
    return MAGIC + _LENGTH.pack(len(payload)) + payload + (rest or b"")


def unseal(data: bytes | None) -> tuple[bytes | None, bytes]:
    """(our payload or None, the assignor's own bytes) from a user data."""
    data = data or b""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
        return None, data
    start = len(MAGIC) + _LENGTH.size
    (size,) = _LENGTH.unpack_from(data, len(MAGIC))
    return data[start:start + size], data[start + size:]


def checking_assignor(base: type[Any], me: AppIdentity,
                      seen: Callable[[list[AppIdentity]], None]) -> type[Any]:
    """``base`` (an aiokafka assignor class, same ``name``) exchanging app identities:
    ``seen`` gets every identified member's identity at each assignment."""
    mine = _encode(me)
    wrapped: type[Any]

    def metadata(cls: type[Any], topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        inner = super(wrapped, cls).metadata(topics)
        return ConsumerProtocolMemberMetadata(inner.version, inner.subscription,
                                              seal(mine, inner.user_data))

    def assign(cls: type[Any], cluster: Any,
               members: Mapping[str, ConsumerProtocolMemberMetadata]) -> dict[str, Any]:
        apps: list[AppIdentity] = []
        plain = {}
        for member_id, meta in members.items():
            payload, rest = unseal(meta.user_data)
            if payload is not None:
                with contextlib.suppress(msgspec.ValidationError):  # not compared
                    apps.append(_decode_one(payload))
            plain[member_id] = ConsumerProtocolMemberMetadata(meta.version,
                                                              meta.subscription, rest)
        note = _encode(apps)
        return {member_id: ConsumerProtocolMemberAssignment(a.version, a.assignment,
                                                            seal(note, a.user_data))
                for member_id, a in super(wrapped, cls).assign(cluster, plain).items()}

    def on_assignment(cls: type[Any], assignment: ConsumerProtocolMemberAssignment) -> None:
        payload, rest = unseal(assignment.user_data)
        super(wrapped, cls).on_assignment(
            ConsumerProtocolMemberAssignment(assignment.version, assignment.assignment, rest))
        if payload is not None:
            with contextlib.suppress(msgspec.ValidationError):
                seen(_decode_all(payload))

    wrapped = type(f"AppChecking{base.__name__}", (base,), {
        "metadata": classmethod(metadata),
        "assign": classmethod(assign),
        "on_assignment": classmethod(on_assignment),
    })
    return wrapped


class AppCheck:
    """One daemon's side: warns once per distinct other app seen in its group."""

    def __init__(self, group: str, me: AppIdentity) -> None:
        self.group = group
        self.me = me
        self._told: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()

    def seen(self, members: list[AppIdentity]) -> None:
        for other in members:
            shape = other.shape()
            if shape == self.me.shape() or shape in self._told:
                continue
            self._told.add(shape)
            log.warning(
                "group %r (the app's name) also has member %s on %s whose handlers %s "
                "(namespaces %s) are not this daemon's %s (namespaces %s): two different "
                "apps run under one name, so they split the topic's partitions and each "
                "skips the other's messages on its own — those are never handled by the "
                "app they are for. Give each app its own name (App(name=...)); if this "
                "is a deploy changing the handlers, it ends when the old daemons stop",
                self.group, other.member, other.host or "?", list(shape[0]),
                list(shape[1]), list(self.me.shape()[0]), list(self.me.shape()[1]))
