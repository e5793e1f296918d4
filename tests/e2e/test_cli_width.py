"""The CLI in an 80-column terminal: every table readable (no heading cut, no id cut, one
line per row), on a real redis-server with a real worker process; and ``--json`` with
counts as integers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.backends import create_adapter
from conveyor.platform.config import Config, load_config
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message, now_ms
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import REPO, RedisServer, Worker, write_config
from tests.servers.process import server_fixture
from tests.servers.redis import _aof_server

pytestmark = pytest.mark.redis

WIDTH = 80
PAST = "2000-01-01T00:00:00Z"
LONG_ERROR = ("the payment service answered 503 Service Unavailable after 3 attempts; "
              "retry later or check https://status.example.com/payments for the outage")


def cli(*args: str, columns: int = WIDTH) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    return result


def fits(text: str, columns: int = WIDTH) -> list[str]:
    """``text``'s lines, each checked to fit ``columns`` and to cut nothing."""
    lines = text.splitlines()
    assert lines, "nothing printed"
    too_wide = [line for line in lines if len(line) > columns]
    assert not too_wide, "\n".join(too_wide)
    return [line.rstrip() for line in lines]


def row(lines: list[str], *cells: str) -> str:
    """The one line holding every one of ``cells`` as whole cells (a row not wrapped nor
    cut; whole, so that a daemon id like ``rec-vm-3980-7157696f`` is no ``0-7``)."""
    def has(line: str, cell: str) -> bool:
        words = cell.split()
        if len(words) == 1:
            return words[0] in line.split()
        return cell in line  # a heading of several words

    found = [line for line in lines if all(has(line, cell) for cell in cells)]
    assert len(found) == 1, (cells, "\n".join(lines))
    return found[0]


def store_letters(config: Config, app: str, count: int) -> None:
    async def run() -> None:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            await adapter.dead_letters.put(app, [
                DeadLetter.of(Message(f"m{n}", StreamId("payments", f"customer-{n:04d}"),
                                      b'{"cents": 100}', enqueued_at_ms=now_ms()),
                              "payments.charge", RuntimeError(LONG_ERROR), 3)
                for n in range(count)
            ])
        finally:
            await adapter.close()

    asyncio.run(run())


width_redis = server_fixture("width_redis", _aof_server, scope="module",
                             doc="One redis-server for this module's tests, which only read.")


@pytest.fixture(scope="module")
def busy_app(width_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Path, Worker]]:
    """App ``rec`` with a running worker, three dead letters with a long error, and a
    ghost app whose group holds retention back: one for the module, as the tests only
    read what it shows (1.7 s to set up)."""
    tmp_path = tmp_path_factory.mktemp("busy_app")
    cfg = write_config(tmp_path / "c.toml", width_redis.url, balancer={"lease_ttl_s": 0.9})
    cli("rewind", "--app", "ghost", "--to", PAST, "--create-group", "--config", str(cfg))
    worker = Worker("w", cfg, tmp_path)
    try:
        store_letters(load_config(cfg, environ={}), "rec", 3)
        wait_until_sync(lambda: worker.alive() and "ready" in worker.stderr, 30,
                        "the worker ready")
        cli("publish", "items", "k1", '{"seq": 1}', "--config", str(cfg))
        yield cfg, worker
    finally:
        assert worker.stop() == 0, worker.stderr


def daemon_id(cfg: Path) -> str:
    report = json.loads(cli("status", "--app", "rec", "--json", "--config", str(cfg)).stdout)
    [member] = report["members"]
    return str(member["id"])


def test_status_of_an_app_fits_80_columns(busy_app: tuple[Path, Worker]) -> None:
    cfg, _ = busy_app
    wait_until_sync(lambda: json.loads(cli("status", "--app", "rec", "--json", "--config",
                                           str(cfg)).stdout)["members"] != [],
                    15, "the daemon's first heartbeat")
    daemon = daemon_id(cfg)
    lines = fits(cli("status", "--app", "rec", "--config", str(cfg)).stdout)
    row(lines, "daemon", "queues", "slots", "handled", "dead", "skipped")
    row(lines, daemon, "0-7")  # the whole id, and its row on one line
    row(lines, "queue", "owner", "lag", "cache", "acks/s")
    assert sum(daemon in line for line in lines) == 1 + 8  # its row, and each queue's owner
    row(lines, "group", "queues", "lag", "last read", "holds retention")
    row(lines, "ghost", "0-7")
    assert "trimming waits for: ghost" in lines
    assert lines[0].startswith("app rec: 1 daemon(s), 3 dead letter(s) stored, lag ")

    wide = fits(cli("status", "--app", "rec", "--wide", "--config", str(cfg),
                    columns=200).stdout, 200)
    row(wide, "daemon", "queues", "host", "pid", "version", "p95", "stalls",
        "pools / cells (workers)")
    from conveyor import __version__
    row(wide, daemon, "0-7", __version__)  # no meter here: p95 "-", no stall: "0"


def test_status_without_app_lists_the_apps_in_80_columns(busy_app: tuple[Path, Worker]) -> None:
    cfg, _ = busy_app
    wait_until_sync(lambda: daemon_id(cfg) != "", 15, "the daemon registered")
    lines = fits(cli("status", "--config", str(cfg)).stdout)
    assert lines[0].startswith("2 app(s) on these queues")
    row(lines, "app", "daemons", "queues", "lag", "last read", "dead letters")
    assert row(lines, "rec ", "0-7").split()[1:2] == ["1"]  # one daemon running
    ghost = row(lines, "ghost", "0-7").split()
    assert ghost[1] == "0" and ghost[-1] == "0"  # no daemon, no dead letters

    apps = json.loads(cli("status", "--json", "--config", str(cfg)).stdout)["apps"]
    assert [(a["app"], a["daemons"], a["dead_letters"]) for a in apps] == [
        ("ghost", 0, 0), ("rec", 1, 3)]


def test_groups_list_fits_80_columns(busy_app: tuple[Path, Worker]) -> None:
    cfg, _ = busy_app
    lines = fits(cli("groups", "list", "--config", str(cfg)).stdout)
    row(lines, "group", "queues", "lag", "last read", "holds retention")
    row(lines, "ghost", "0-7")
    row(lines, "rec ", "0-7")


def test_dlq_list_shows_one_line_per_letter_in_80_columns(
    busy_app: tuple[Path, Worker],
) -> None:
    cfg, _ = busy_app
    letters = json.loads(cli("dlq", "list", "--app", "rec", "--json", "--config",
                             str(cfg)).stdout)
    assert len(letters) == 3 and letters[0]["error"] == LONG_ERROR  # whole in JSON
    lines = fits(cli("dlq", "list", "--app", "rec", "--config", str(cfg)).stdout)
    row(lines, "id", "stream", "failed (UTC)", "error")
    for letter in letters:
        # Its row on one line, the error cut to what is left, not stacked over many lines.
        line = row(lines, letter["id"], f"payments/{letter['key']}", letter["failed_at"][5:16])
        assert "RuntimeError: the " in line and line.endswith("…"), line
    wide = fits(cli("dlq", "list", "--app", "rec", "--wide", "--config", str(cfg),
                    columns=200).stdout, 200)
    row(wide, "handler", "error type", "attempts", "replay of")


def test_status_json_gives_counts_as_integers(busy_app: tuple[Path, Worker]) -> None:
    cfg, _ = busy_app

    def stats() -> dict[str, object]:
        report = json.loads(cli("status", "--app", "rec", "--json", "--config",
                                str(cfg)).stdout)
        return dict(report["members"][0]["stats"]) if report["members"] else {}

    wait_until_sync(lambda: stats().get("handled") == 1, 15, "a heartbeat after the publish")
    found = stats()
    for key in ("handled", "skipped", "slots.in_use", "slots.available", "memory_used_bytes",
                "memory_total_bytes"):
        assert type(found[key]) is int, (key, found[key])
    assert type(found["at"]) is float
