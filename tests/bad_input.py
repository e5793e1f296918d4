"""The wire-format suite's cases and harness, shared by the Redis and Kafka tests.

Each case is one malformed entry, written with the broker's own client (as any producer
could), between good messages of the same queue, on the same and on other streams. A
daemon of app ``probe`` handles namespace ``good``. The promise under test: every good
message is handled exactly once; every bad one is in the dead-letter store with a
reason and its raw bytes; nothing stays pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor import App, Config, MessageContext, WorkerDaemon
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Undecodable
from tests.conftest import wait_until

GOOD = "good"
APP = "probe"
CASE = "x-case"


@dataclass(frozen=True)
class Case:
    """A malformed entry: ``fields`` in order (Redis fields / Kafka headers), ``body``.

    ``expect`` is the dead letter's error type: ``Undecodable`` (its metadata cannot be
    read: stored with its raw bytes) or ``DecodeError`` (its body does not decode into the
    handler's type: stored as the message it was).
    """

    name: str
    fields: tuple[tuple[bytes, bytes], ...]
    body: bytes | None = b'{"seq": -1}'
    """None: no body at all (Redis: no ``body`` field; Kafka: a null value)."""
    expect: str = "Undecodable"
    key: bytes | None = None
    """Kafka: the record key (None: the good stream's key)."""


KEY = b"@key"
"""In a case's fields: the key of the good stream the bad entry sits in."""


def case_fields(case: Case, key: str) -> list[tuple[bytes, bytes]]:
    """The case's fields, tagged with its name (so its dead letter can be found)."""
    fields = [(n, key.encode() if v == KEY else v) for n, v in case.fields]
    return [(CASE.encode(), case.name.encode()), *fields]


@dataclass
class Probe:
    """The ``probe`` app: records (stream key, seq) of every good message handled."""

    handled: list[tuple[str, int]] = field(default_factory=list)

    def app(self) -> App:
        app = App(APP)

        @app.handler(GOOD, retry_attempts=1)
        async def on_good(body: dict[str, Any], ctx: MessageContext) -> None:
            self.handled.append((ctx.message.stream.key, int(body["seq"])))

        return app


def good_stream_on_queue(total: int, queue: int, avoid: str = "") -> str:
    """A key of namespace ``good`` the hash ring puts on ``queue``."""
    from conveyor.platform.mapper import HashRingQueueMapper

    mapper = HashRingQueueMapper(total)
    for i in range(10_000):
        key = f"s{i}"
        if key != avoid and mapper.queue_for(StreamId(GOOD, key)) == queue:
            return key
    raise AssertionError(f"no good stream on queue {queue}")


@dataclass
class Outcome:
    probe: Probe
    published: list[tuple[str, int]]
    daemon: WorkerDaemon
    key: str
    """The good stream the bad entries claim to belong to."""


async def run_cases(
    config: Config,
    cases: Sequence[Case],
    write_bad: Callable[[int, Case, str], Awaitable[None]],
    *,
    queue: int = 0,
    rounds_after: int = 3,
) -> Outcome:
    """Good, bad, good ... on ``queue``: two good streams there and one elsewhere.

    ``write_bad(queue, case, good_key)`` writes one malformed entry on ``queue``. The
    daemon starts after everything is written, so bad and good entries share batches.
    """
    probe = Probe()
    daemon = WorkerDaemon(probe.app(), config)
    client = daemon.client
    total = config.queues.total
    a = good_stream_on_queue(total, queue)
    b = good_stream_on_queue(total, queue, avoid=a)
    elsewhere = good_stream_on_queue(total, (queue + 1) % total) if total > 1 else b
    published: list[tuple[str, int]] = []
    seq = 0

    async def good_round() -> None:
        nonlocal seq
        for key in (a, b, elsewhere):
            await client.publish(GOOD, key, {"seq": seq})
            published.append((key, seq))
            seq += 1

    await good_round()
    for case in cases:
        await write_bad(queue, case, a)
        await good_round()
    for _ in range(rounds_after):
        await good_round()
    await daemon.start()
    try:
        await wait_until(
            lambda: len(probe.handled) >= len(published)
            and daemon.stats.dead_lettered >= len(cases),
            30, what=f"{len(published)} good handled and {len(cases)} dead-lettered",
        )
        await wait_until(lambda: _all_acked(daemon), 30, what="every entry acknowledged")
    finally:
        await daemon.stop()
    return Outcome(probe, published, daemon, a)


async def _all_acked(daemon: WorkerDaemon) -> bool:
    lags = await asyncio.gather(*(daemon.adapter.lag(q, APP)
                                  for q in range(daemon.config.queues.total)))
    return sum(lags) == 0


def letters_by_case(letters: list[DeadLetter]) -> dict[str, DeadLetter]:
    out: dict[str, DeadLetter] = {}
    for letter in letters:
        msg = letter.message
        if isinstance(msg, Undecodable):
            tags = [v for k, v in msg.raw_fields if k == CASE.encode()]
            name = tags[0].decode() if tags and tags[0] is not None else ""
        else:
            name = msg.headers.get(CASE, "")
        out[name] = letter
    return out


def assert_cases_dead_lettered(
    letters: list[DeadLetter], cases: Sequence[Case], key: str
) -> None:
    """Each case once in the store, with a reason and the bytes it was written with."""
    found = letters_by_case(letters)
    assert len(letters) == len(cases), [ltr.error for ltr in letters]
    for case in cases:
        letter = found.get(case.name)
        assert letter is not None, f"{case.name}: no dead letter"
        assert letter.error_type == case.expect, (case.name, letter.error_type, letter.error)
        assert letter.error, case.name
        assert letter.form == "full", case.name
        assert letter.message.body == (case.body or b""), case.name
        if isinstance(letter.message, Undecodable):
            raw = [(k, v) for k, v in letter.message.raw_fields if k != b"body"]
            assert raw == case_fields(case, key), case.name


def assert_not_utf8_named(found: dict[str, DeadLetter], named: dict[str, str]) -> None:
    """Each case of ``named`` is a letter whose reason names what is not UTF-8 (its
    value: ``named[case]``), as ``DecodeError: <what> is not UTF-8 text: <bytes>``; it
    was Python's ``'utf-8' codec can't decode byte 0xc3 in position 0``, naming nothing
    of the entry."""
    for case, what in named.items():
        assert found[case].error.startswith(f"DecodeError: {what} is not UTF-8 text: "), (
            case, found[case].error)


def assert_reasons_name_the_fault(found: dict[str, DeadLetter]) -> None:
    """The letters of the cases ``ns-given-twice``, ``attempt-given-twice``,
    ``body-not-its-content-type``, ``string-not-utf8`` and ``msgpack-string-not-utf8``
    (each broker's suite has them) say what was wrong. A string of a body that is not
    UTF-8 was a ``UnicodeDecodeError`` whose text named neither the body nor the byte
    (``'utf-8' codec can't decode byte 0xff in position 0``, the position in the
    string)."""
    assert found["ns-given-twice"].error == (
        "DecodeError: cv-ns given twice with different values (b'good', then b'other'): "
        "which one is meant is not known")
    assert found["attempt-given-twice"].error.startswith(
        "DecodeError: cv-attempt given twice with different values (b'1', then b'2')")
    assert found["body-not-its-content-type"].error.startswith(
        "cannot decode body as dict (read as JSON: its content type "
        "'application/x-protobuf' is neither JSON nor msgpack): JSON is malformed")
    not_text = "a string in it is not UTF-8 text: b'\\xff'"
    assert found["string-not-utf8"].error_type == "DecodeError"
    assert found["string-not-utf8"].error == f"cannot decode body as dict: {not_text}"
    # msgspec 0.21 and later name no bytes of a msgpack string (the JSON one is found in
    # the body): "a string in it is not UTF-8 text" alone
    assert found["msgpack-string-not-utf8"].error in {
        f"cannot decode body as dict (read as msgpack, its content type): {text}"
        for text in (not_text, not_text.partition(":")[0])}
