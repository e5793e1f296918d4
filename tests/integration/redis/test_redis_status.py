"""`conveyor status` against a worker process on Redis: throughput from heartbeats."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conveyor import Client, Publish, load_config
from tests.conftest import reaped, wait_until_sync
from tests.integration.redis.conftest import REPO, RedisServer, Worker, write_config


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--app", "rec",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_status_shows_throughput_without_watch_and_watch_stops_after_count(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url, balancer={"lease_ttl_s": 0.9})
    worker = Worker("w", cfg, tmp_path, work_ms=5)
    workers.append(worker)
    n = 20_000  # 8 streams x 5 ms: ~12 s of work, so the readings below see it busy
    async def publish() -> None:
        async with Client.from_config(load_config(cfg, environ={})) as c:
            await c.publish_batch([Publish("items", f"s{i % 8}", {"seq": i}) for i in range(n)])

    asyncio.run(publish())

    def busy_with_a_rate() -> bool:
        result = status("--config", str(cfg), "--json")
        assert result.returncode == 0, result.stderr
        rates = [q["acks_per_s"] for q in json.loads(result.stdout)["queues"]]
        return any(r is not None and r > 0 for r in rates)

    wait_until_sync(busy_with_a_rate, 30, what="a heartbeat with acks/s > 0, read once")
    started = time.monotonic()
    watched = status("--config", str(cfg), "--watch", "0.3", "--count", "3")
    elapsed = time.monotonic() - started
    assert watched.returncode == 0, watched.stderr
    assert "acks/s" in watched.stdout and "Traceback" not in watched.stderr
    assert elapsed >= 3 * 0.3  # it waits before each re-read, three times, then stops
    assert worker.alive()


def test_count_without_watch_is_a_usage_error(redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    result = status("--config", str(cfg), "--count", "2")
    assert result.returncode == 2 and "--count needs --watch" in result.stderr


async def publish_items(cfg: Path, group: str | None = None) -> None:
    """40 messages over 40 streams (all 8 queues), after ``group`` is created on each."""
    async with Client.from_config(load_config(cfg, environ={})) as c:
        if group is not None:
            for q in range(8):
                await c.adapter.ensure_group(q, group)  # type: ignore[attr-defined]
        await c.publish_batch([Publish("items", f"s{i}", {"i": i}) for i in range(40)])


def test_a_consumer_group_another_tool_named_is_listed_not_fatal(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # A group no app could have (made with redis-cli, by another tool): status, groups
    # list and the console's poll failed whole ("app name ... may only contain"), and
    # rich read its "[/x]" as markup.
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    asyncio.run(publish_items(cfg))
    odd = '[/x] "><svg onload=alert(1)> \x1b[31m'
    redis_server.client().xgroup_create("t:q:0", odd, id="0")
    for args in (["status"], ["groups", "list"]):
        # Wide enough for its row: at 80 columns a name this long folds over lines.
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", *args, "--config", str(cfg)],
                              cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert '[/x] "><svg onload=alert(1)> \\x1b[31m' in done.stdout, done.stdout
    apps = subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--json",
                           "--config", str(cfg)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    [row] = json.loads(apps.stdout)["apps"]
    assert (row["app"], row["daemons"], row["dead_letters"]) == (odd, None, None)


def test_a_key_of_another_type_where_a_stream_belongs_is_named_and_the_rest_reported(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # `SET t:q:3 x` (or a hash where app rec's dead letters go): status, groups list and
    # dlq list stopped at it with one WRONGTYPE line, showing nothing of the rest.
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    asyncio.run(publish_items(cfg, group="rec"))
    admin = redis_server.client()
    on_three = admin.xlen("t:q:3")
    admin.delete("t:q:3")
    admin.set("t:q:3", "x")
    admin.hset("t:dlq:rec", "a", "b")
    queue_line = ("conveyor: warning: redis key t:q:3 (queue 3) is a string, not a stream: "
                  "no daemon reads the queue, a publish to it fails and status counts it "
                  "empty; rename or delete the key")
    letters_line = ("conveyor: warning: redis key t:dlq:rec (app 'rec''s dead letters) is a "
                    "hash, not a stream: the app's dead letters cannot be stored (the "
                    "messages wait unacknowledged) and dlq commands find none; rename or "
                    "delete the key")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conveyor.cli", *args, "--config",
                               str(cfg)], cwd=REPO, capture_output=True, text=True,
                              timeout=60)

    every = run("status", "--json")
    one = run("status", "--app", "rec", "--json")
    groups = run("groups", "list", "--json")
    letters = run("dlq", "list", "--app", "rec")
    assert [r.returncode for r in (every, one, groups, letters)] == [0, 0, 0, 0], (
        every.stderr, one.stderr, groups.stderr, letters.stderr)
    warned = [line for line in one.stderr.splitlines() if "redis key" in line]
    assert warned == [queue_line, letters_line]
    assert [line for line in every.stderr.splitlines() if "redis key" in line] == [
        queue_line, letters_line]
    assert [line for line in groups.stderr.splitlines() if "redis key" in line] == [queue_line]
    assert [line for line in letters.stderr.splitlines() if "redis key" in line] == [
        letters_line]
    report = json.loads(one.stdout)
    lags = {q["queue"]: q["lag"] for q in report["queues"]}
    assert lags == {q: admin.xlen(f"t:q:{q}") if q != 3 else 0 for q in range(8)}
    assert sum(lags.values()) == 40 - on_three
    assert report["dead_letters"] == 0
    assert [{k: p[k] for k in ("store", "holds", "found")} for p in report["store_problems"]
            ] == [
        {"store": "t:q:3", "holds": "queue 3", "found": "string"},
        {"store": "t:dlq:rec", "holds": "app 'rec''s dead letters", "found": "hash"}]
    [row] = json.loads(every.stdout)["apps"]
    assert (row["app"], row["lag"], row["dead_letters"]) == ("rec", 40 - on_three, 0)
    [group] = json.loads(groups.stdout)["groups"]
    assert (group["group"], group["queues"]) == ("rec", [0, 1, 2, 4, 5, 6, 7])
    assert letters.stdout.splitlines()[0].startswith("app rec: 0 dead letter(s)")


def test_watch_outlives_a_redis_outage_and_reads_again_once_it_is_back(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """`status --watch` refreshes until Ctrl-C, as documented: a Redis down for longer
    than [redis] retry_max_s ended it (exit 1) when an operator watched most, during a
    restart. A failed reading is now a line under the last one, and the next is tried."""
    cfg = write_config(tmp_path / "c.toml", redis_server.url, redis={"retry_max_s": 0.3})

    probe = redis_server.client()  # one connection (again after the restart), not one a call

    def readings() -> int:  # each reading of status opens connections (about 18)
        return int(probe.info("stats")["total_connections_received"])

    base = readings()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "status", "--app", "rec", "--watch", "0.2",
         "--config", str(cfg)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    with reaped(proc):
        wait_until_sync(lambda: readings() >= base + 60, 20, "status to read a few times")
        redis_server.stop()
        stopped_at = time.monotonic()  # readings fail while it is down: 0.3 s of retries
        wait_until_sync(lambda: proc.poll() is not None
                        or time.monotonic() - stopped_at >= 1.5, 10,
                        "status to exit, or readings to fail for 1.5 s")
        assert proc.poll() is None, proc.communicate()
        redis_server.start()
        base = readings()
        wait_until_sync(lambda: proc.poll() is not None or readings() >= base + 20, 20,
                        "a reading once Redis is back")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "app rec:" in out, (out, err)



def test_watch_in_a_pipe_prints_each_reading_as_it_comes_and_ends_with_its_reader(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Off a terminal, rich's Live printed only the last reading, once the watch ended:
    `status --watch 2 | head -1` printed nothing and never ended, `| tee log` logged
    nothing until Ctrl-C. Each reading is now printed as it is read, and the watch ends
    (no traceback) once the reader of its output has gone."""
    import threading

    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "status", "--app", "rec", "--watch", "0.2",
         "--config", str(cfg)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    lines: list[str] = []

    def read_two_readings() -> None:  # as `head` does: read a little, then go
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if sum(x.startswith("app rec:") for x in lines) == 2:
                break
        proc.stdout.close()

    reader = threading.Thread(target=read_two_readings, daemon=True)
    with reaped(proc):
        reader.start()
        wait_until_sync(lambda: not reader.is_alive(), 20, "two readings, each as it came")
        wait_until_sync(lambda: proc.poll() is not None, 20, "the watch to end with its reader")
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert proc.returncode == 1, err  # click's exit for a reader gone (EPIPE), said nowhere
