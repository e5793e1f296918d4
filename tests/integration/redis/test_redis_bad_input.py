"""Malformed entries on Redis: one bad entry never takes good ones with it.

Each case is written with plain XADD (what ``redis-cli XADD`` or any client can do)
between good messages; see tests/bad_input.py for the promise checked.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.platform.config import Config, load_config
from tests.bad_input import (
    APP,
    KEY,
    Case,
    assert_cases_dead_lettered,
    assert_not_utf8_named,
    assert_reasons_name_the_fault,
    case_fields,
    letters_by_case,
    run_cases,
)
from tests.servers import RedisServer

NS = (b"cv-ns", b"good")
K = (b"cv-key", KEY)
CASES = [
    Case("attempt-not-a-number", (NS, K, (b"cv-attempt", b"abc"))),
    Case("attempt-negative", (NS, K, (b"cv-attempt", b"-1"))),
    Case("ts-overflows-any-codec", (NS, K, (b"cv-ts", b"99999999999999999999999")),
         body=b"not json"),
    Case("ts-garbage", (NS, K, (b"cv-ts", b"12x"))),
    Case("ts-with-spaces", (NS, K, (b"cv-ts", b" 12"))),
    Case("ns-not-utf8", ((b"cv-ns", b"\xc3\x28"), K)),
    Case("ns-missing", (K,)),
    Case("ns-empty", ((b"cv-ns", b""), K)),
    Case("key-not-utf8", (NS, (b"cv-key", b"\xff\xfe"))),
    Case("id-not-utf8", (NS, K, (b"cv-id", b"\xff"))),
    Case("content-type-not-utf8", (NS, K, (b"content-type", b"\xff"))),
    Case("header-value-not-utf8", (NS, K, (b"x-h", b"\xc3\x28"))),
    Case("header-name-not-utf8", (NS, K, (b"\xff\xfe", b"v"))),
    Case("ns-repeated-second-bad", (NS, K, (b"cv-ns", b"\xff"))),
    Case("body-not-json", (NS, K), body=b"not json", expect="DecodeError"),
    Case("body-missing", (NS, K), body=None),  # was handled as an empty body
    Case("ns-given-twice", (NS, K, (b"cv-ns", b"other"))),  # was handled as namespace other
    Case("attempt-given-twice", (NS, K, (b"cv-attempt", b"1"), (b"cv-attempt", b"2"))),
    Case("body-not-its-content-type", (NS, K, (b"content-type", b"application/x-protobuf")),
         body=b"\x08\x96\x01", expect="DecodeError"),
    Case("string-not-utf8", (NS, K), body=b'{"seq": "\xff"}', expect="DecodeError"),
    Case("msgpack-string-not-utf8", (NS, K, (b"content-type", b"application/msgpack")),
         body=b"\x81\xa3seq\xa1\xff", expect="DecodeError"),
]


def redis_config(server: RedisServer, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "queues": {"adapter": "redis", "total": 2},
        "redis": {"url": server.url},
        "balancer": {"kind": "static"},
        "worker": {"poll_timeout_ms": 100, "max_batch": 256},
    }
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, environ={}, overrides=overrides)


def xadd_writer(server: RedisServer) -> Any:
    async def write(queue: int, case: Case, key: str) -> None:
        client = aioredis.Redis(port=server.port)
        flat = [x for pair in case_fields(case, key) for x in pair]
        if case.body is not None:
            flat += [b"body", case.body]
        await client.execute_command("XADD", f"conveyor:q:{queue}", "*", *flat)
        await client.aclose()

    return write


async def test_every_malformed_entry_is_dead_lettered_and_its_neighbours_are_handled(
    redis_server: RedisServer,
) -> None:
    config = redis_config(redis_server)
    out = await run_cases(config, CASES, xadd_writer(redis_server))
    # every good message exactly once, in order per stream
    assert sorted(out.probe.handled) == sorted(out.published)
    assert len(out.probe.handled) == len(set(out.probe.handled))
    letters = await _read_letters(config)
    assert_cases_dead_lettered(letters, CASES, out.key)
    assert_reasons_name_the_fault(letters_by_case(letters))
    assert_not_utf8_named(letters_by_case(letters), {
        "ns-not-utf8": "field 'cv-ns'", "key-not-utf8": "field 'cv-key'",
        "id-not-utf8": "field 'cv-id'", "content-type-not-utf8": "field 'content-type'",
        "header-value-not-utf8": "field 'x-h'",
        "header-name-not-utf8": "a field's name"})
    # nothing pending for the app, on any queue; a restart delivers nothing again
    client = redis_server.client()
    for q in range(config.queues.total):
        assert client.xpending(f"conveyor:q:{q}", APP)["pending"] == 0
    assert out.daemon.report().abandoned == 0


async def test_odd_but_readable_entries_are_handled_as_written(
    redis_server: RedisServer,
) -> None:
    # What an outside harness XADDs that is still a message by the wire format: each
    # handled once under its own key, among good messages, none dead-lettered.
    from conveyor import WorkerDaemon
    from tests.bad_input import Probe, good_stream_on_queue
    from tests.conftest import wait_until

    redis_server.client().flushall()
    config = redis_config(redis_server)
    key = good_stream_on_queue(config.queues.total, 0)
    odd: list[list[bytes]] = [  # the fields between cv-key and body, an entry each
        [b"", b"an empty field name"],
        [x for i in range(500) for x in (b"x-h%d" % i, b"v")],  # 500 user headers
        [b"content-type", b"application/x-unknown"],  # read as JSON
        [b"cv-ns", b"good"],  # the same value twice: one field
        [b"x-pad", b"y" * 1_500_000],  # a 1.5 MB entry
    ]
    client = aioredis.Redis(port=redis_server.port)
    probe = Probe()
    daemon = WorkerDaemon(probe.app(), config)
    written: list[tuple[str, int]] = []
    try:
        for n, fields in enumerate(odd, start=1):
            await daemon.client.publish("good", key, {"seq": 1000 + n})
            written.append((key, 1000 + n))
            await client.execute_command("XADD", "conveyor:q:0", "*", "cv-ns", "good",
                                         "cv-key", "odd", *fields, "body", b'{"seq": -%d}' % n)
            written.append(("odd", -n))
        await client.execute_command("XADD", "conveyor:q:0", "*", "cv-ns", "good",
                                     "body", b'{"seq": -99}')  # no cv-key: stream key ""
        written.append(("", -99))
    finally:
        await client.aclose()
    await daemon.start()
    try:
        await wait_until(lambda: len(probe.handled) >= len(written), 30,
                         what="every entry handled")
    finally:
        await daemon.stop()
    assert redis_server.client().xpending("conveyor:q:0", APP)["pending"] == 0
    assert sorted(probe.handled) == sorted(written)
    assert daemon.stats.dead_lettered == 0


async def _read_letters(config: Config) -> list[Any]:
    from conveyor.backends import create_adapter

    adapter = create_adapter("redis", config)
    try:
        return await adapter.dead_letters.read(APP, limit=1000)
    finally:
        await adapter.close()


async def test_a_letter_is_readable_with_redis_cli_reason_first_then_the_entry(
    redis_server: RedisServer,
) -> None:
    config = redis_config(redis_server)
    cases = [c for c in CASES if c.name in ("ts-overflows-any-codec", "body-not-json")]
    out = await run_cases(config, cases, xadd_writer(redis_server))
    entries = redis_server.client().xrange(f"conveyor:dlq:{APP}")
    assert len(entries) == 2
    for _, fields in entries:
        names = list(fields)
        assert names[:3] == [b"cv-dl-v", b"cv-dl-app", b"cv-dl-handler"]
        assert fields[b"cv-dl-app"] == APP.encode() and fields[b"cv-dl-error"]
        assert fields[b"body"] == b"not json"  # the body as it was published
        assert fields[b"cv-key"] == out.key.encode()


printable = st.binary(min_size=0, max_size=12)
entry = st.lists(
    st.tuples(st.sampled_from([b"cv-ns", b"cv-key", b"cv-id", b"content-type", b"cv-ts",
                               b"cv-attempt", b"x-h", b"\xff"]), printable),
    min_size=1, max_size=6,
)


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(entry, min_size=20, max_size=20))
async def test_any_fields_between_good_messages_lose_nothing(
    redis_server: RedisServer, entries: list[list[tuple[bytes, bytes]]],
) -> None:
    # Every entry is another app's (skipped), undecodable, or a good one: with unroutable
    # messages dead-lettered, each non-good entry ends in the store; goods all handled.
    redis_server.client().flushall()
    config = redis_config(redis_server, dead_letters={"unroutable": "dead-letter"})
    cases = [Case(f"h{i}", tuple(fields)) for i, fields in enumerate(entries)]
    for case in cases:  # a random entry may claim namespace "good": make it not decode
        assert case.body == b'{"seq": -1}'
    out = await run_cases(config, cases, xadd_writer(redis_server), rounds_after=1)
    good = [(k, s) for k, s in out.probe.handled if s >= 0]
    assert sorted(good) == sorted(out.published)
    stray = [h for h in out.probe.handled if h[1] < 0]  # random entries that were valid
    letters = await _read_letters(config)
    assert len(letters) + len(stray) == len(cases)
    for letter in letters:
        assert letter.error and letter.error_type in {"Undecodable", "Unroutable"}


async def _poison_and_strangers(config: Config, strangers: int) -> Any:
    """5 messages whose handler always fails, then ``strangers`` of a namespace no
    handler of the app takes; returns the stopped daemon once all are acknowledged."""
    from conveyor import App, Publish, WorkerDaemon
    from tests.conftest import wait_until

    app = App(APP)

    @app.handler("orders", retry_attempts=1)
    async def poison(body: dict[str, int]) -> None:
        raise ValueError(f"order {body['n']} is poison")

    daemon = WorkerDaemon(app, config)
    await daemon.client.publish_batch([Publish("orders", f"o{n}", {"n": n}) for n in range(5)])
    for start in range(0, strangers, 10_000):
        await daemon.client.publish_batch([
            Publish("someone-else", f"k{i % 500}", {"i": i})
            for i in range(start, min(start + 10_000, strangers))
        ])
    await daemon.start()
    try:
        await wait_until(
            lambda: daemon.stats.dead_lettered + daemon.stats.skipped == 5 + strangers,
            120, interval_s=0.1, what="every message dead-lettered or skipped",
        )
    finally:
        await daemon.stop()
    return daemon


async def test_five_dead_letters_survive_a_hundred_thousand_strangers_with_few_log_lines(
    redis_server: RedisServer, caplog: Any,
) -> None:
    # Another app's messages are skipped (the default) and logged once per namespace,
    # not once per message; no cap evicts the real dead letters.
    caplog.set_level("INFO", logger="conveyor")
    config = redis_config(redis_server, queues={"total": 8})
    daemon = await _poison_and_strangers(config, 101_000)
    assert daemon.stats.skipped == 101_000 and daemon.stats.dead_lettered == 5
    letters = await _read_letters(config)
    assert sorted(ltr.error for ltr in letters) == [f"order {n} is poison" for n in range(5)]
    lines = [r for r in caplog.records if r.levelno >= 30]  # warnings and worse
    assert 1 <= len(lines) <= 20, [r.getMessage() for r in lines]


async def test_a_configured_bound_evicts_the_oldest_letters_and_counts_them(
    redis_server: RedisServer, caplog: Any,
) -> None:
    caplog.set_level("INFO", logger="conveyor")
    config = redis_config(redis_server, queues={"total": 8},
                          dead_letters={"unroutable": "dead-letter", "max_entries": 1000})
    daemon = await _poison_and_strangers(config, 3_000)
    assert daemon.stats.dead_lettered == 3_005
    assert daemon.stats.dead_letters_evicted == 2_005
    assert redis_server.client().xlen(f"conveyor:dlq:{APP}") == 1000
    stats = daemon.stats_snapshot()
    assert stats["dead_letters_evicted"] == 2_005
    evictions = [r for r in caplog.records if "evicted" in r.getMessage()]
    assert 1 <= len(evictions) <= 5  # logged, throttled
    assert len([r for r in caplog.records if r.levelno >= 30]) <= 30


HUGE = 1_000_000


@pytest.mark.parametrize("unroutable", ["skip", "dead-letter"])
async def test_a_worker_names_what_a_foreign_entry_says_in_one_short_log_line(
    redis_server: RedisServer, caplog: Any, unroutable: str,
) -> None:
    # A stream key and a cv-id are any text; a namespace is checked by clients, not on
    # the wire. A foreign entry's, with a line break and a megabyte long, went into the
    # worker's warnings as written: a line forged after "dead-lettering message", and
    # lines a megabyte long (the skip warning, the Unroutable reason). Each is handled as
    # before (good ones once, the bad one dead-lettered byte for byte); only the log
    # shows them escaped and cut short.
    from conveyor import WorkerDaemon
    from tests.bad_input import GOOD, Probe, good_stream_on_queue
    from tests.conftest import wait_until

    redis_server.client().flushall()
    caplog.set_level("WARNING", logger="conveyor")
    config = redis_config(redis_server, dead_letters={"unroutable": unroutable})
    good = good_stream_on_queue(config.queues.total, 0)
    key = "k\n2026-11-29 04:00:00 ERROR forged\u2028" + "k" * HUGE
    ident = "i\r\n2026-11-29 04:00:00 ERROR forged " + "i" * HUGE
    namespace = "n\u2028forged" + "n" * HUGE
    foreign = [  # (fields, body): a body that does not decode, a namespace no one takes
        ([b"cv-ns", GOOD.encode(), b"cv-key", key.encode(), b"cv-id", ident.encode()],
         b"not json"),
        ([b"cv-ns", namespace.encode(), b"cv-key", b"k"], b"{}"),
    ]
    probe = Probe()
    daemon = WorkerDaemon(probe.app(), config)
    client = aioredis.Redis(port=redis_server.port)
    published: list[tuple[str, int]] = []
    try:
        for seq, (fields, body) in enumerate(foreign):
            await daemon.client.publish(GOOD, good, {"seq": seq})
            published.append((good, seq))
            await client.execute_command("XADD", "conveyor:q:0", "*", *fields, "body", body)
        await daemon.client.publish(GOOD, good, {"seq": 99})
        published.append((good, 99))
    finally:
        await client.aclose()
    letters_expected = 2 if unroutable == "dead-letter" else 1
    await daemon.start()
    try:
        await wait_until(
            lambda: len(probe.handled) >= len(published)
            and daemon.stats.dead_lettered + daemon.stats.skipped >= 2,
            30, what="the good messages handled, the foreign ones dead-lettered or skipped")
    finally:
        await daemon.stop()
    assert probe.handled == published  # each once, in order
    assert daemon.stats.dead_lettered == letters_expected
    assert redis_server.client().xpending("conveyor:q:0", APP)["pending"] == 0
    letters = {ltr.error_type: ltr for ltr in await _read_letters(config)}
    decode = letters["DecodeError"].message  # stored as it came
    assert (decode.stream.key, decode.id) == (key, ident)
    if unroutable == "dead-letter":
        assert letters["Unroutable"].message.stream.namespace == namespace
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    for line in warnings:
        assert len(line.splitlines()) == 1 and line.isprintable(), line[:300]
        assert len(line) < 2000, line[:300]

    def shown(text: str) -> str:  # its first 100 characters escaped, and its length
        return f"{repr(text[:100])[1:-1]}… ({len(text):,} characters)"

    lettered = sorted(w for w in warnings if w.startswith("dead-lettering message "))
    assert f"dead-lettering message {shown(ident)} of good/{shown(key)} (handler " \
        "'tests.bad_input.Probe.app.<locals>.on_good') after 0 attempt(s): DecodeError: " \
        "cannot decode body as dict: JSON is malformed: invalid character (byte 4)" in lettered
    assert shown(key).startswith("k\\n2026-11-29 04:00:00 ERROR forged\\u2028kkk")
    named = "namespace '" + shown(namespace).replace("…", "'…", 1)  # quoted
    assert named.startswith("namespace 'n\\u2028forgednnn")
    if unroutable == "skip":
        assert len(lettered) == 1
        assert sum(w.startswith("app 'probe' skips messages of " + named)
                   for w in warnings) == 1, warnings
    else:  # the reason names it so too
        assert len(lettered) == 2
        assert sum(w.endswith(f"Unroutable: no handler of app 'probe' subscribes to {named}")
                   for w in lettered) == 1, lettered
