"""`conveyor dlq` as an operator runs it, on a real Redis and the Kafka-protocol broker:
poison messages are dead-lettered, listed with their reasons, replayed after the fix
and handled once; a replay killed midway and run again replays each letter once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.backends import create_adapter
from conveyor.cli import dlq as dlq_cli
from conveyor.cli import main
from conveyor.client import Publish, SyncClient
from conveyor.console.actions import Choice, replay_letters
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config, load_config
from conveyor.platform.ids import StreamId
from conveyor.platform.message import H_REPLAY_OF, DeadLetter, Message, Undecodable, now_ms
from conveyor.platform.operations.dlq import KILL_ENV
from tests.conftest import stop_when, wait_until_sync
from tests.integration.redis.conftest import write_config
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
APP = "dlq-e2e"


def conveyor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("kafka", marks=pytest.mark.kafka)])
def config_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A redis config on a server of its own, or a kafka one on a fresh topic (2 queues)."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        yield write_config(tmp_path / "redis.toml", server.url, queues={"total": 2},
                           worker={"drain_timeout_s": 5.0})
        return
    broker = request.getfixturevalue("tansu")
    base = (ROOT / "configs" / "kafka.toml").read_text()
    path = tmp_path / "kafka.toml"
    path.write_text(
        base.replace('bootstrap = "127.0.0.1:9092"', f'bootstrap = "{broker.bootstrap}"')
        .replace('topic = "conveyor"', f'topic = "dlq-{uuid.uuid4().hex[:10]}"')
        .replace("total = 8 ", "total = 2 ")
        .replace("drain_timeout_s = 30", "drain_timeout_s = 5")
    )
    yield path


def on_adapter(config: Config, work: str, *args: object) -> object:
    """``adapter.<work>(*args)`` on a fresh adapter (closed after); ``work`` may name a
    facet's method (``dead_letters.count``)."""

    async def run() -> object:
        adapter: QueueAdapter = create_adapter(config.queues.adapter, config)
        try:
            target: object = adapter
            for name in work.split("."):
                target = getattr(target, name)
            return await target(*args)  # type: ignore[operator]
        finally:
            await adapter.close()

    return asyncio.run(run())


def start_worker(config_path: Path, out: Path, fixed: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_FIXED": str(fixed)}
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.poison_app:app",
         "--config", str(config_path)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def handled(out: Path) -> list[tuple[int, str, str]]:
    """(n, message id, replay-of) per handled message, as the app wrote them."""
    rows = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    return [(int(n), ident, replay_of) for n, ident, replay_of in rows]


@pytest.mark.slow
def test_poison_letters_are_listed_with_reasons_and_replayed_once_after_the_fix(
    config_path: Path, tmp_path: Path,
) -> None:
    config = load_config(config_path)
    out, fixed = tmp_path / "handled.txt", tmp_path / "fixed"
    good, poison = [1, 2, 3], [4, 5, 6, 7]
    worker = start_worker(config_path, out, fixed)
    try:
        with SyncClient.from_config(config) as client:
            client.publish_batch(Publish("jobs", f"k{n}", {"n": n, "poison": n in poison})
                                 for n in good + poison)
        wait_until_sync(lambda: len(handled(out)) == 3
                        and on_adapter(config, "dead_letters.count", APP) == 4,
                        60, "3 handled and 4 dead-lettered")

        listed = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), "--json")
        assert listed.returncode == 0, listed.stderr
        letters = {int(entry["key"][1:]): entry for entry in json.loads(listed.stdout)}
        assert sorted(letters) == poison
        for n, entry in letters.items():
            assert (entry["namespace"], entry["handler"], entry["error_type"], entry["error"],
                    entry["attempts"], entry["replay_of"]) == (
                "jobs", "jobs.handle", "ValueError", f"poison {n}", 2, None)
        table = conveyor("dlq", "list", "--app", APP, "--config", str(config_path))
        assert "4 dead letter(s)" in table.stdout and "poison 4" in table.stdout
        shown = conveyor("dlq", "show", letters[4]["id"], "--app", APP, "--config",
                         str(config_path), "--json")
        assert json.loads(shown.stdout)["body"] == '{"n":4,"poison":true}', shown.stderr
        status = conveyor("status", "--app", APP, "--config", str(config_path))
        assert "4 dead letter(s) stored" in status.stdout, status.stderr

        fixed.touch()  # the fix is deployed
        replayed = conveyor("dlq", "replay", "--all", "--app", APP, "--config",
                            str(config_path))
        assert replayed.returncode == 0, replayed.stderr
        assert "replayed 4 letter(s)" in replayed.stdout
        stop_when(worker, lambda: len(handled(out)) >= 7, 60, "the replayed letters handled")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # Exactly once each, no duplicates allowed: nothing crashed and the worker drained.
    rows = handled(out)
    assert sorted(n for n, _, _ in rows) == good + poison
    for n, ident, replay_of in rows:
        if n in poison:  # the original message (its cv-id), naming the letter it came from
            assert (ident, replay_of) == (letters[n]["message_id"], letters[n]["id"])
        else:
            assert replay_of == "-"
    empty = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), "--json")
    assert json.loads(empty.stdout) == []


def test_a_replay_killed_midway_and_run_again_publishes_each_letter_once(
    config_path: Path, tmp_path: Path,
) -> None:
    config = load_config(config_path)
    kafka = config.queues.adapter == "kafka"
    numbers = range(10, 16)
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m{n}", StreamId("jobs", f"k{n}"),
                              json.dumps({"n": n, "poison": True}).encode(),
                              enqueued_at_ms=now_ms()), "jobs.handle", f"poison {n}", 2)
        for n in numbers
    ])
    # Batches of 2. Redis: killed after the 2nd batch (each letter's script is atomic:
    # there is no point within it). Kafka: killed after the 2nd batch is published,
    # before its letters are recorded as replayed.
    kill_at = "published:2" if kafka else "replayed:2"
    first = conveyor("dlq", "replay", "--all", "--batch", "2", "--app", APP, "--config",
                     str(config_path), env={KILL_ENV: kill_at})
    assert first.returncode == -9, (first.returncode, first.stderr)
    assert first.stdout.count("replayed ") == (2 if kafka else 4)
    left = on_adapter(config, "dead_letters.count", APP)
    assert left == (4 if kafka else 2)  # kafka: the 2nd batch is published, still listed
    again = conveyor("dlq", "replay", "--all", "--batch", "2", "--app", APP, "--config",
                     str(config_path))
    assert again.returncode == 0, again.stderr
    assert f"replayed {left} letter(s)" in again.stdout
    assert on_adapter(config, "dead_letters.count", APP) == 0
    # What the queues hold for the app (no worker of it has read them yet): one each.
    assert sum(int(str(on_adapter(config, "lag", q, APP)))
               for q in range(config.queues.total)) == 6

    out, fixed = tmp_path / "handled.txt", tmp_path / "fixed"
    fixed.touch()
    worker = start_worker(config_path, out, fixed)
    stop_when(worker, lambda: len(handled(out)) >= 6, 60, "the 6 replayed messages handled")
    # Each letter's message handled exactly once: no duplicate is allowed (the replay's
    # promise; the worker drained cleanly), and none is lost.
    rows = handled(out)
    assert sorted(n for n, _, _ in rows) == list(numbers)
    assert sorted(ident for _, ident, _ in rows) == sorted(f"m{n}" for n in numbers)
    assert len({replay_of for _, _, replay_of in rows}) == 6


@pytest.mark.slow
def test_operator_mistakes_are_usage_errors(config_path: Path) -> None:
    kafka = load_config(config_path).queues.adapter == "kafka"
    where = ["--app", APP, "--config", str(config_path)]
    cases = [
        (["show", "not-an-id", *where], "error: ID: not a dead-letter id"),
        (["purge", "--id", "x", "--yes", *where], "error: --id: not a dead-letter id"),
        # Well formed, but beyond what the backend's ids hold (Redis: 64 bits a part).
        (["show", "0:" + "9" * 20 if kafka else f"{2**64}-0", *where],
         "error: ID: not a dead-letter id"),
        (["replay", "--id", "0:" + "9" * 20 if kafka else f"1-{2**64}", *where],
         "error: --id: not a dead-letter id"),
        (["show", "0:999999" if kafka else "1-0", *where], "no dead letter"),
        (["replay", "--id", "0:999999" if kafka else "1-0", *where], "nothing was done"),
        (["replay", *where], "either --all or --id"),
        (["replay", "--all", "--id", "1-0", *where], "either --all or --id"),
        (["purge", "--all", *where], "add --yes"),
        (["list", "--app", APP], "memory adapter keeps dead letters"),
    ]
    for args, message in cases:
        result = conveyor("dlq", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, args
        if "not a dead-letter id" in message:  # refused before the broker is asked: a
            [line] = result.stderr.splitlines()  # warning about the app came first
            assert line.startswith(f"conveyor: {message}"), (args, line)


def test_an_app_with_no_letters_and_no_group_gets_a_warning_naming_the_groups(
    config_path: Path,
) -> None:
    """`--app` with a typo read as an app with nothing to fix ("0 dead letter(s)",
    "replayed 0 letter(s)", exit 0): a warning says no such app ran here, as `status`
    says it; an app with letters, or with a group, gets none."""
    config = load_config(config_path)
    grouped = conveyor("rewind", "--app", "grouped", "--to", "2000-01-01T00:00:00Z",
                       "--create-group", "--config", str(config_path))
    assert grouped.returncode == 0, grouped.stderr
    on_adapter(config, "dead_letters.put", APP, [DeadLetter.of(
        Message("m-1", StreamId("jobs", "k"), b"{}", enqueued_at_ms=now_ms()),
        "jobs.handle", "boom", 1)])
    typo = f"{APP}x"
    said = {}
    for args in (["list"], ["replay", "--all"], ["purge", "--all", "--yes"]):
        result = conveyor("dlq", *args, "--app", typo, "--config", str(config_path))
        assert result.returncode == 0, (args, result.stderr)
        said[args[0]] = result.stderr
    for known in (APP, "grouped"):
        result = conveyor("dlq", "list", "--app", known, "--config", str(config_path))
        assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    expected = (f"conveyor: warning: --app {typo!r} has no dead letters and no consumer "
                "group on any queue (a typo, or an app that never ran; groups here: grouped)")
    assert [line for text in said.values() for line in text.splitlines()
            if "persistence" not in line] == [expected] * 3


def test_a_filter_no_letter_matches_names_the_values_there_and_the_one_meant(
    config_path: Path,
) -> None:
    """`--handler on_order` (the short name, as the testing kit takes it) matched no
    letter of `shop.on_order`, and `replay --all` said only "replayed 0": the warning
    names the letters' values and the one meant; nothing is replayed or purged. An
    `--id` the filters drop did nothing without a word either: refused, as an id not
    stored is."""
    config = load_config(config_path)
    on_adapter(config, "dead_letters.put", APP, [DeadLetter.of(
        Message(f"m-{n}", StreamId("orders", f"k{n}"), b"{}", enqueued_at_ms=now_ms()),
        "shop.on_order", "boom", 3, "ValueError") for n in range(2)])
    where = ["--app", APP, "--config", str(config_path)]
    runs = {
        "list": conveyor("dlq", "list", "--handler", "on_order", *where),
        "replay": conveyor("dlq", "replay", "--all", "--error-type", "valueerror", *where),
        "purge": conveyor("dlq", "purge", "--all", "--yes", "--namespace", "payments",
                          *where),
    }
    said = {name: [line for line in run.stderr.splitlines() if "persistence" not in line]
            for name, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values()), said
    assert said == {
        "list": ["conveyor: warning: --handler 'on_order' matches no letter (their "
                 "handlers: shop.on_order); did you mean --handler shop.on_order?"],
        "replay": ["conveyor: warning: --error-type 'valueerror' matches no letter (their "
                   "error types: ValueError); did you mean --error-type ValueError?"],
        "purge": ["conveyor: warning: --namespace 'payments' matches no letter (their "
                  "namespaces: orders)"],
    }
    assert "replayed 0 letter(s)" in runs["replay"].stdout
    first = json.loads(conveyor("dlq", "list", "--json", *where).stdout)[0]["id"]
    for args in (["replay", "--id", first, "--handler", "other.h"],
                 ["purge", "--yes", "--id", first, "--error-type", "KeyError"]):
        named = conveyor("dlq", *args, *where)  # an id the filters drop: refused, as unknown
        assert named.returncode == 2, (args, named.stderr)
        assert named.stderr.splitlines()[-1] == (
            f"conveyor: error: --id: letter(s) {first} do not match --handler/--namespace/"
            "--error-type (`conveyor dlq show ID` gives a letter's); nothing was done")
    assert on_adapter(config, "dead_letters.count", APP) == 2
    matched = conveyor("dlq", "list", "--handler", "shop.on_order", *where)
    assert [line for line in matched.stderr.splitlines()
            if "persistence" not in line] == [], matched.stderr


def test_show_prints_a_producers_control_characters_escaped(config_path: Path) -> None:
    """A key, header, content type or body is whatever its producer wrote: `dlq show`
    prints an escape sequence or a carriage return as text, not to the terminal, and
    each field on its own line (a body keeps its own lines); --json is the data as is."""
    config = load_config(config_path)
    key, ctype = "k\x1b[31mRED", "text/plain\nforged: line"
    on_adapter(config, "dead_letters.put", APP, [DeadLetter.of(
        Message("m-esc", StreamId("jobs", key), b"line 1\nline 2\r\x1b[2J",
                headers={"h\x07": "v\x1b"}, content_type=ctype, enqueued_at_ms=now_ms()),
        "jobs.handle", "boom\x1b[0m", 1)])
    listed = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), "--json")
    [entry] = json.loads(listed.stdout)
    assert (entry["key"], entry["content_type"]) == (key, ctype)
    shown = conveyor("dlq", "show", entry["id"], "--app", APP, "--config", str(config_path))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out, out
    lines = out.splitlines()
    assert "key:           k\\x1b[31mRED" in lines
    assert "content_type:  text/plain\\nforged: line" in lines
    assert "headers:       h\\x07=v\\x1b" in lines
    assert "error:         boom\\x1b[0m" in lines
    assert "body:          line 1" in lines and "line 2\\r\\x1b[2J" in lines


def test_a_letter_with_no_error_type_shows_its_error_alone_and_a_dash_for_the_type(
    config_path: Path,
) -> None:
    """A letter made from a text (``DeadLetter.of(msg, handler, "boom", 1)``), or stored
    so by another producer, has an empty error type: ``dlq list`` showed ``: boom``,
    ``--wide`` and ``show`` a blank. --json keeps the empty string."""
    config = load_config(config_path)
    on_adapter(config, "dead_letters.put", APP, [DeadLetter.of(
        Message("m-untyped", StreamId("jobs", "k1"), b"{}", enqueued_at_ms=now_ms()),
        "jobs.handle", "boom", 1)])
    args = ("--app", APP, "--config", str(config_path))
    [letter] = json.loads(conveyor("dlq", "list", *args, "--json").stdout)
    assert (letter["error_type"], letter["error"]) == ("", "boom")
    listed = conveyor("dlq", "list", *args)
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if letter["id"] in line]
    assert row.rstrip().endswith("  boom") and ": boom" not in row, row
    wide = conveyor("dlq", "list", *args, "--wide")
    [row] = [line for line in wide.stdout.splitlines() if letter["id"] in line]
    assert row.split()[2:5] == ["jobs.handle", "-", "boom"], row
    shown = conveyor("dlq", "show", letter["id"], *args)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "error_type:    -" in lines and "error:         boom" in lines, shown.stdout


def test_show_gives_an_undecodable_entrys_fields_as_they_were(config_path: Path) -> None:
    """No field of the entry could be read, so the letter has no namespace or key of
    its own: `dlq show` prints what the entry held, field by field (its error says why)."""
    config = load_config(config_path)
    raw = ((b"cv-ns", b"orders"), (b"cv-key", b"raw"), (b"nobody", b"x\xff"),
           (b"body", b"payload"))
    entry = Undecodable(id="1-0", stream=StreamId("", ""), body=b"payload",
                        content_type="application/octet-stream", enqueued_at_ms=now_ms(),
                        reason="KeyError: 'cv-id'", raw_fields=raw)
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(entry, "", "undecodable: KeyError: 'cv-id'", 1, "Undecodable")])
    listed = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), "--json")
    [letter] = json.loads(listed.stdout)
    shown = conveyor("dlq", "show", letter["id"], "--app", APP, "--config",
                     str(config_path), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["raw_fields"] == [["cv-ns", "orders"], ["cv-key", "raw"], ["nobody", "x\\xff"],
                                  ["body", "payload"]]
    assert data["error"] == "undecodable: KeyError: 'cv-id'" and data["body"] == "payload"
    text = conveyor("dlq", "show", letter["id"], "--app", APP, "--config", str(config_path))
    assert ("raw_fields:    cv-ns=orders, cv-key=raw, nobody=x\\xff, body=payload"
            in text.stdout.splitlines()), text.stdout


def test_show_gives_no_fields_for_an_undecodable_letter_stored_without_them(
    config_path: Path,
) -> None:
    """A letter too large to store in full (a 1.5 MB record with a bad header) is kept
    shorter, without the entry's fields: on Kafka `dlq show` printed placeholders as
    if the record had held them (raw_fields: cv-ns=, cv-id=…, cv-ts=0)."""
    config = load_config(config_path)
    raw = ((b"cv-ns", b"orders"), (b"cv-attempt", b"abc"), (b"body", b"payload"))
    entry = Undecodable(id="1-0", stream=StreamId("", ""), body=b"payload",
                        content_type="application/octet-stream", enqueued_at_ms=now_ms(),
                        reason="DecodeError: cv-attempt", raw_fields=raw, raw_key=b"k")
    full = DeadLetter.of(entry, "", "DecodeError: cv-attempt", 0, "Undecodable")
    minimal = full.shortened("too large")
    assert minimal is not None
    bare = minimal.shortened("too large")
    assert bare is not None
    on_adapter(config, "dead_letters.put", APP, [minimal, bare])
    listed = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), "--json")
    assert [(x["form"], "raw_fields" in x, "raw_key" in x) for x in json.loads(listed.stdout)
            ] == [("minimal", False, False), ("bare", False, False)]
    for letter in json.loads(listed.stdout):
        text = conveyor("dlq", "show", letter["id"], "--app", APP, "--config",
                        str(config_path))
        assert text.returncode == 0, text.stderr
        names = [line.split(":")[0] for line in text.stdout.splitlines()]
        assert "raw_fields" not in names and "raw_key" not in names, text.stdout
        assert f"form:          {letter['form']}" in text.stdout.splitlines()


def test_list_says_more_letters_are_there_only_when_the_limit_left_some_out(
    config_path: Path,
) -> None:
    """With --handler/--error-type the app's total is not what was left out: a filter
    that matched 1 of 3 has nothing more to show, whatever --limit says."""
    config = load_config(config_path)
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m-{n}", StreamId("jobs", f"k{n}"), b"{}",
                              enqueued_at_ms=now_ms()), handler, "boom", 1)
        for n, handler in enumerate(["jobs.a", "jobs.a", "jobs.b"])])

    def notes(*args: str) -> list[str]:
        result = conveyor("dlq", "list", "--app", APP, "--config", str(config_path), *args)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines()
                if "showing" in line or "match" in line]

    assert notes() == []
    assert notes("--limit", "2") == ["showing 2 of 3; --limit shows more"]
    assert notes("--handler", "jobs.b") == ["1 of 3 match --handler/--namespace/--error-type"]
    assert notes("--handler", "nope") == ["0 of 3 match --handler/--namespace/--error-type"]
    assert notes("--handler", "jobs.a", "--limit", "2") == [
        "2 of 3 match --handler/--namespace/--error-type"]
    assert notes("--handler", "jobs.a", "--limit", "1") == [
        "showing the first 1 that match --handler/--namespace/--error-type; --limit shows more"]


def test_a_table_lists_at_most_table_max_letters_and_json_any_number(
    config_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rich lays a table out whole before its first line: `--limit 1000000000` on 50,000
    letters took 16 s and 290 MB. Past ``TABLE_MAX`` (10,000; 2 here) a table is a usage
    error naming --limit, and at it the note points at --json, which lists any number
    (each letter's JSON held, not the letter) and is one JSON array."""
    monkeypatch.setattr(dlq_cli, "TABLE_MAX", 2, raising=False)
    config = load_config(config_path)
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m-{n}", StreamId("jobs", f"k{n}"), b"{}",
                              enqueued_at_ms=now_ms()), "jobs.handle", "boom", 1)
        for n in range(3)])
    args = ["dlq", "list", "--app", APP, "--config", str(config_path)]
    refused = CliRunner().invoke(main, [*args, "--limit", "3"])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.splitlines() == [
        "conveyor: error: --limit 3: a table shows at most 2 letters (rich lays it out whole "
        "before printing); --json lists any number"]
    at_most = CliRunner().invoke(main, [*args, "--limit", "2"])
    assert at_most.exit_code == 0, at_most.output
    assert "showing 2 of 3; --json shows more" in at_most.stdout.splitlines()
    below = CliRunner().invoke(main, [*args, "--limit", "1"])
    assert "showing 1 of 3; --limit shows more" in below.stdout.splitlines()
    listed = CliRunner().invoke(main, [*args, "--limit", "1000000000", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [letter["message_id"] for letter in json.loads(listed.stdout)] == [
        "m-0", "m-1", "m-2"]
    assert json.loads(CliRunner().invoke(main, [*args, "--limit", "2", "--json"]).stdout) == (
        json.loads(listed.stdout)[:2])


@pytest.mark.redis
def test_entries_that_are_no_letters_hide_no_letter_and_are_named_once(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """600 entries another tool XADDed to the app's dead-letter stream — more than a
    page (500) — before two letters: `dlq list` listed no letter and `replay --all`
    replayed none. Now the letters are listed and replayed, one warning line names the
    stream and an entry, and `dlq show` of such an entry is a usage error."""
    config_path = write_config(tmp_path / "redis.toml", redis_server.url, queues={"total": 2})
    config = load_config(config_path)
    client = redis_server.client()
    key = f"t:dlq:{APP}"
    with client.pipeline(transaction=False) as pipe:
        for n in range(600):
            pipe.xadd(key, {"written-by": "another tool", "n": n})
        junk = [entry_id.decode() for entry_id in pipe.execute()]
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m-{n}", StreamId("jobs", f"k{n}"), b"{}",
                              enqueued_at_ms=now_ms()), "jobs.handle", "boom", 1)
        for n in (1, 2)])
    args = ("--app", APP, "--config", str(config_path))

    listed = conveyor("dlq", "list", *args, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [entry["key"] for entry in json.loads(listed.stdout)] == ["k1", "k2"]
    said = [line for line in listed.stderr.splitlines() if "no dead letters" in line]
    assert len(said) == 1 and f"of {key} " in said[0] and junk[0] in said[0], listed.stderr
    shown = conveyor("dlq", "show", junk[0], *args)
    assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
    assert f"conveyor: error: no dead letter {junk[0]} of app" in shown.stderr
    replayed = conveyor("dlq", "replay", "--all", *args)
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed 2 letter(s) of app '{APP}'" in replayed.stdout
    assert client.xlen(key) == 600


def queued_replays(config: Config) -> Counter[str]:
    """How many messages the app's queues hold per letter they were replayed from (no
    worker reads them in these tests)."""

    async def run() -> Counter[str]:
        adapter: QueueAdapter = create_adapter(config.queues.adapter, config)
        seen: Counter[str] = Counter()
        try:
            for queue in range(config.queues.total):
                receiver = adapter.create_receiver(queue, APP)
                await receiver.initialize()
                try:
                    while batch := await receiver.get_messages(1000, 0.5):
                        seen.update(m.headers.get(H_REPLAY_OF, "") for m in batch)
                        await receiver.acknowledge([m.token for m in batch])
                finally:
                    await receiver.shutdown()
        finally:
            await adapter.close()
        return seen

    return asyncio.run(run())


def test_two_operators_replaying_the_same_letters_at_once_publish_each_once(
    config_path: Path,
) -> None:
    """Two `dlq replay --all` started together and the console's replay at the same
    time: every letter is published exactly once — none twice (Redis: each letter's
    publish-and-delete is one script; Kafka: the first claim in the ops topic wins) and
    none lost (each ends replayed by one of them)."""
    config = load_config(config_path)
    n = 2000
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m{i}", StreamId("jobs", f"k{i}"), b"{}",
                              enqueued_at_ms=now_ms()), "jobs.handle", "boom", 1)
        for i in range(n)])
    ids = [s.id for s in on_adapter(config, "dead_letters.page", APP, n)]  # type: ignore[attr-defined]
    command = [sys.executable, "-m", "conveyor.cli", "dlq", "replay", "--all", "--batch", "50",
               "--app", APP, "--config", str(config_path)]
    clis = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    assert clis[0].stdout is not None
    first = clis[0].stdout.readline()  # the CLIs are under way: the console joins in
    assert first.startswith("replayed "), first
    console = asyncio.run(replay_letters(config, Choice(APP, every=True)))
    outs = [cli.communicate(timeout=120) for cli in clis]
    outs[0] = (first + outs[0][0], outs[0][1])
    assert [cli.returncode for cli in clis] == [0, 0], outs
    counts = [int(out.rsplit("replayed ", 1)[1].split()[0]) for out, _ in outs]
    assert sum(counts) + len(console["replayed"]) == n, (counts, len(console["replayed"]))
    for _, err in outs:  # what another run did is one line, not a line per letter
        assert err.count("gone when this replay came to them") <= 1, err
        assert len(err.splitlines()) <= 2, err  # (and the broker's producer-id warning)
    assert on_adapter(config, "dead_letters.count", APP) == 0
    seen = queued_replays(config)
    assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}


def test_replay_and_purge_take_the_oldest_limit_letters_the_filters_keep(
    config_path: Path,
) -> None:
    """`--namespace` picks letters by their message's namespace (one whose handler the
    app dropped, say) and `--limit` takes the oldest N of those the filters keep: a
    trial replay of a few letters before the rest. Only those are touched."""
    config = load_config(config_path)
    on_adapter(config, "dead_letters.put", APP, [
        DeadLetter.of(Message(f"m{i}", StreamId(ns, f"k{i}"), b"{}", enqueued_at_ms=now_ms()),
                      f"{ns}.handle", "boom", 1)
        for i, ns in enumerate(["jobs", "old", "jobs", "old", "jobs", "old", "jobs"])])
    ids = [s.id for s in on_adapter(config, "dead_letters.page", APP, 10)]  # type: ignore[attr-defined]
    where = ["--app", APP, "--config", str(config_path)]
    replayed = conveyor("dlq", "replay", "--all", "--namespace", "jobs", "--limit", "2", *where)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 2 letter(s)" in replayed.stdout
    purged = conveyor("dlq", "purge", "--all", "--namespace", "old", "--limit", "2", "--yes",
                      *where)
    assert "purged 2 letter(s)" in purged.stdout, purged.stderr
    left = json.loads(conveyor("dlq", "list", "--namespace", "jobs", "--json", *where).stdout)
    assert [entry["id"] for entry in left] == [ids[4], ids[6]]
    left = json.loads(conveyor("dlq", "list", "--json", *where).stdout)
    assert [entry["id"] for entry in left] == [ids[4], ids[5], ids[6]]
    assert sorted(queued_replays(config)) == [ids[0], ids[2]]
    wrong = conveyor("dlq", "replay", "--id", ids[4], "--limit", "1", *where)
    assert wrong.returncode == 2 and "--limit goes with --all" in wrong.stderr, wrong.stderr
