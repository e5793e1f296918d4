"""The supervisor's channel to its children: one typed protocol, both ends, no crash on noise."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import typing

import pytest

from conveyor.platform.balancing.membership import MemberInfo
from conveyor.workers.supervisor.child import EventChannel, SupervisedBalancer, _command_loop
from conveyor.workers.supervisor.process import ChildCommandFailed, ChildGone, ChildProcess
from conveyor.workers.supervisor.protocol import (
    Acquire,
    Acquired,
    Alive,
    Command,
    Event,
    Failed,
    ProtocolError,
    Ready,
    Release,
    Released,
    Stop,
    Stopped,
    decode_command,
    decode_event,
    encode,
)
from tests.integration.test_rebalance import Listener

COMMANDS: list[Command] = [Acquire(3), Release(5), Stop()]
EVENTS: list[Event] = [
    Ready("worker-1", 4242, http_port=None),
    Ready("worker-2", 4243, http_port=9100),
    Acquired(3),
    Released(5),
    Failed("acquire", 3, "BrokerConnectionError: redis unreachable"),
    Failed("release", 5, "ShutdownError: stopping"),
    Stopped("handled 3, abandoned 0", {"handled": 3, "abandoned": 0}),
    Alive(),
]


def test_every_command_and_event_survives_the_wire_unchanged() -> None:
    # Every member of each union has a sample: a new message without one fails here.
    assert {type(c) for c in COMMANDS} == set(typing.get_args(Command))
    assert {type(e) for e in EVENTS} == set(typing.get_args(Event))
    for command in COMMANDS:
        line = encode(command)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode_command(line) == command
    for event in EVENTS:
        line = encode(event)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode_event(line) == event


def test_the_wire_is_one_json_object_tagged_by_op_or_event() -> None:
    assert encode(Acquire(3)) == b'{"op":"acquire","queue":3}\n'
    assert encode(Stop()) == b'{"op":"stop"}\n'
    assert encode(Failed("release", 5, "boom")) == (
        b'{"event":"failed","op":"release","queue":5,"error":"boom"}\n')
    assert decode_event(b'{"event": "ready", "id": "w", "pid": 7}') == Ready("w", 7, None)


@pytest.mark.parametrize("line", [
    b"not json at all\n",
    b'{"event": "exploded", "queue": 1}\n',  # an event this end does not know
    b'{"event": "acquired"}\n',  # a known event missing its queue
    b'{"op": "acquire", "queue": 1}\n',  # a command, on the event channel
])
def test_a_line_that_is_not_an_event_raises_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="not an event"):
        decode_event(line)


def test_a_line_that_is_not_a_command_raises_a_protocol_error() -> None:
    for line in (b"\x00\xff garbage\n", b'{"op": "explode"}\n', b'{"op": "release"}\n'):
        with pytest.raises(ProtocolError, match="not a command"):
            decode_command(line)


async def test_the_supervisor_logs_and_skips_a_line_that_is_not_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    child = ChildProcess(2)
    released = child._expect(Released, 5)
    reader = asyncio.StreamReader()
    reader.feed_data(b"garbled {\n")
    reader.feed_data(b'{"event": "exploded", "queue": 5}\n')
    reader.feed_data(encode(Released(5)))
    reader.feed_eof()
    await child._read(reader)
    assert await released == Released(5)  # read on past the noise
    noise = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(noise) == 2 and all("process #2" in r.getMessage() for r in noise)


async def test_a_child_reporting_a_failed_move_fails_the_wait_instead_of_hanging() -> None:
    child = ChildProcess(4)
    acquired = child._expect(Acquired, 3)
    released = child._expect(Released, 5)
    reader = asyncio.StreamReader()
    reader.feed_data(encode(Failed("acquire", 3, "BrokerConnectionError: redis unreachable")))
    reader.feed_data(encode(Released(5)))
    reader.feed_eof()
    await child._read(reader)
    with pytest.raises(ChildCommandFailed, match="#4 could not acquire queue 3: Broker"):
        await acquired
    assert (await released).queue == 5
    late = child._expect(Released, 6)  # the channel is closed: fails at once
    with pytest.raises(ChildGone):
        await asyncio.wait_for(late, 1)


async def test_a_child_logs_and_skips_a_line_that_is_not_a_command_and_obeys_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    balancer, daemon = SupervisedBalancer(), Listener()
    await balancer.start(MemberInfo.for_this_process("x-"), daemon)
    stdin = asyncio.StreamReader()
    for line in (b"garbled {\n", encode(Acquire(1)), b'{"op": "explode"}\n',
                 encode(Acquire(2)), encode(Release(1)), encode(Stop()),
                 encode(Acquire(7))):  # after the stop: never read
        stdin.feed_data(line)
    read_fd, write_fd = os.pipe()

    async def lines() -> asyncio.StreamReader:
        return stdin

    try:
        await asyncio.wait_for(_command_loop(balancer, EventChannel(write_fd), lines)(), 5)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as events:
            sent = [decode_event(line) for line in events]
    finally:
        for fd in (read_fd, write_fd):
            with contextlib.suppress(OSError):  # closed already
                os.close(fd)
    # Moves run concurrently: their answers' order is theirs, each queue's is fixed.
    assert sorted(sent, key=repr) == sorted([Acquired(1), Acquired(2), Released(1)], key=repr)
    assert daemon.owned == {2}
    noise = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(noise) == 2 and all("not a command" in m for m in noise)


def test_a_child_whose_supervisor_is_gone_drops_its_events_without_an_error() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the supervisor is gone
    channel = EventChannel(write_fd)
    try:
        channel.send(Stopped("handled 0", {"handled": 0}))  # raised BrokenPipeError before
        assert channel.supervisor_gone
        channel.send(Stopped("again", {}))  # dropped, not written
    finally:
        os.close(write_fd)
