"""What the supervisor and its children say to each other: typed, one JSON object a line.

Both ends import this module and nothing else writes or parses the lines:

* supervisor → child, on the child's stdin, a :data:`Command`: :class:`Acquire`,
  :class:`Release` or :class:`Stop` (drain everything and exit). End of input means
  stop too, so a child never outlives its supervisor.
* child → supervisor, on the file descriptor given on the child's command line (not
  stdout, which handler code may print to), an :data:`Event`: :class:`Ready`, then
  :class:`Acquired` / :class:`Released` / :class:`Failed` as it carries out commands,
  and :class:`Stopped` last; :class:`Alive` every :data:`BEAT_S` throughout.

On the wire a command is tagged by ``"op"``, an event by ``"event"``::

    {"op":"acquire","queue":3}
    {"event":"failed","op":"acquire","queue":3,"error":"BrokerError: ..."}

A line that does not decode (garbled, or a message this end does not know) raises
:class:`ProtocolError`; each end logs it and reads on.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from conveyor.platform.errors import ConveyorError

# -- supervisor -> child ----------------------------------------------------------------

LOG_LEVEL_ENV = "CONVEYOR_CHILD_LOG_LEVEL"
"""The variable a child reads its log level from (``INFO`` when unset): the supervisor
sets it to the CLI's ``--log-level``, so its children log at the level it was given."""

CONFIG_REFUSED = 2
"""A child's exit status when it refused the configuration or the broker's settings
(a :class:`ConfigError`, e.g. a Redis that may evict): the same status the CLI gives a
bad config, so ``worker --processes`` exits as ``worker`` does."""



class Acquire(msgspec.Struct, frozen=True, tag_field="op", tag="acquire"):
    """Start pulling ``queue``; answered by :class:`Acquired` once it is pulled, or
    :class:`Failed`."""

    queue: int


class Release(msgspec.Struct, frozen=True, tag_field="op", tag="release"):
    """Drain ``queue`` (in-flight messages finish and are acknowledged) and shut its
    receiver down; answered by :class:`Released` after that, or :class:`Failed`."""

    queue: int


class Stop(msgspec.Struct, frozen=True, tag_field="op", tag="stop"):
    """Drain every queue and exit; answered by :class:`Stopped`."""


Command = Acquire | Release | Stop

# -- child -> supervisor ----------------------------------------------------------------


class Ready(msgspec.Struct, frozen=True, tag_field="event", tag="ready"):
    """The daemon runs and takes commands. ``id`` is its member id (``conveyor
    status``); ``http_port`` its loopback ``/metrics`` port when ``[http] port`` is set."""

    id: str
    pid: int
    http_port: int | None = None


class Acquired(msgspec.Struct, frozen=True, tag_field="event", tag="acquired"):
    queue: int


class Released(msgspec.Struct, frozen=True, tag_field="event", tag="released"):
    queue: int


class Failed(msgspec.Struct, frozen=True, tag_field="event", tag="failed"):
    """An :class:`Acquire` or :class:`Release` of ``queue`` failed with ``error``. The
    child no longer has the queue assigned: a lease it still holds is given up or
    lapses, so whoever acquires the queue next waits for it."""

    op: Literal["acquire", "release"]
    queue: int
    error: str


class Stopped(msgspec.Struct, frozen=True, tag_field="event", tag="stopped"):
    """The daemon drained and stopped: its drain report as text and as its fields
    (which the supervisor adds up)."""

    report: str
    counts: dict[str, int]


class Alive(msgspec.Struct, frozen=True, tag_field="event", tag="alive"):
    """A beat, every :data:`BEAT_S` from a thread of the child's own: a child whose beats
    stop (it was SIGSTOPped, or hangs holding the interpreter) is killed by the supervisor
    after ``[supervisor] silent_child_s``. A handler blocking the child's event loop does
    not stop them: the child's leases deal with that."""


BEAT_S = 0.5

Event = Ready | Acquired | Released | Failed | Stopped | Alive


class ProtocolError(ConveyorError):
    """A line on the supervisor's channel that is not a message this end knows."""


_encoder = msgspec.json.Encoder()
_commands: msgspec.json.Decoder[Command] = msgspec.json.Decoder(Command)
_events: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)


def encode(message: Command | Event) -> bytes:
    """``message`` as one line, newline included."""
    return _encoder.encode(message) + b"\n"


def decode_command(line: bytes) -> Command:
    try:
        return _commands.decode(line)
    except msgspec.DecodeError as exc:  # ValidationError is one
        raise ProtocolError(f"not a command: {line[:200]!r} ({exc})") from None


def decode_event(line: bytes) -> Event:
    try:
        return _events.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not an event: {line[:200]!r} ({exc})") from None
