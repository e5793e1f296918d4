"""``conveyor worker --processes MIN:MAX`` on a real redis-server, with real processes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import pytest

from conveyor import Client, Publish, load_config
from conveyor.backends import create_adapter
from conveyor.client import SyncClient
from conveyor.workers.supervisor.assignment import assign
from conveyor.workers.supervisor.process import ChildGone, ChildProcess
from conveyor.workers.supervisor.scaler import SupervisorSettings
from conveyor.workers.supervisor.supervisor import Supervisor
from tests.conftest import reaped, wait_until, wait_until_sync
from tests.integration.redis.conftest import REPO, RedisServer, read_records, write_config

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_a_burst_adds_processes_and_afterwards_they_go_back_to_min_losing_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url,
                       balancer={"kind": "static"}, slots={"count": 8})
    record = tmp_path / "handled.rec"
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", CONVEYOR_TEST_RECORD=str(record),
        CONVEYOR_TEST_WORK_MS="4",
        CONVEYOR_SUPERVISOR__LAG_PER_PROCESS="300",
        CONVEYOR_SUPERVISOR__INSPECTION_PERIOD_MS="200",
        CONVEYOR_SUPERVISOR__SCALE_UP_BACKOFF_S="0.5",
        CONVEYOR_SUPERVISOR__SCALE_DOWN_BACKOFF_S="0.5",
    )
    err_path = tmp_path / "supervisor.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
             "--config", str(cfg), "--processes", "1:3"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    supervisor = psutil.Process(proc.pid)

    def stderr() -> str:
        return err_path.read_text(errors="replace")

    def children() -> int:
        return len([c for c in supervisor.children() if c.status() != psutil.STATUS_ZOMBIE])

    try:
        wait_until_sync(lambda: "own 8 queue(s)" in stderr(), 30, "the first process")
        assert children() == 1
        # The line the single-process worker prints, naming the first process's daemon.
        assert re.search(r"^conveyor: worker rec-\S+ ready$", stderr(), re.M), stderr()
        n = 6000
        with SyncClient.from_config(load_config(cfg)) as client:
            client.publish_batch(Publish("items", f"k{i % 200}", {"seq": i}) for i in range(n))
        burst_at = time.monotonic()
        wait_until_sync(lambda: "scale up to 2" in stderr(), 10, "a scale-up")
        scaled_up_after_s = time.monotonic() - burst_at
        assert scaled_up_after_s < 5, stderr()
        wait_until_sync(lambda: len(read_records([record])) >= n, 60, "the burst handled")
        wait_until_sync(lambda: "scale down to 1 " in stderr() and children() == 1, 30,
                        "the return to MIN")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, stderr()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = stderr()
    assert "Traceback" not in log, log
    peak = max(int(m) for m in re.findall(r"scale up to (\d+)", log))
    assert 2 <= peak <= 3
    rows = read_records([record])
    ids = [row[5] for row in rows]
    assert len(ids) == n and len(set(ids)) == n, "lost or duplicated across scale changes"
    assert len({row[1] for row in rows}) >= 2, "more than one process should have worked"
    # One drained line for all processes, the scaled-down ones included: every message
    # handled and acknowledged once, nothing abandoned.
    drained = re.findall(r"^conveyor: drained (.*)$", log, re.M)
    assert len(drained) == 1, log
    counts = dict(field.split("=") for field in drained[0].split())
    assert (counts["handled"], counts["acked"], counts["abandoned"]) == (str(n), str(n), "0")
    seqs: dict[str, list[int]] = {}
    for row in rows:
        seqs.setdefault(row[3], []).append(row[4])
    assert all(s == sorted(s) for s in seqs.values()), "per-stream order across moves"


def test_a_killed_process_is_replaced_and_its_queues_taken_over_without_loss(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # A lease of 3 s: long enough that the surviving process keeps its leases on a
    # loaded machine (with 1.5 s it sometimes lost one too, and the duplicates of that
    # queue came on top of the victim's), short enough for a quick takeover.
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 8},
                       worker={"cache_capacity": 64}, balancer={"lease_ttl_s": 3.0})
    record = tmp_path / "handled.rec"
    env = dict(os.environ, PYTHONUNBUFFERED="1", CONVEYOR_TEST_RECORD=str(record),
               CONVEYOR_TEST_WORK_MS="2")
    err_path = tmp_path / "supervisor.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
             "--config", str(cfg), "--processes", "2:2"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    supervisor = psutil.Process(proc.pid)

    def stderr() -> str:
        return err_path.read_text(errors="replace")

    def live_children() -> list[psutil.Process]:
        return [c for c in supervisor.children() if c.status() != psutil.STATUS_ZOMBIE]

    try:
        wait_until_sync(lambda: "2 process(es) own 8 queue(s)" in stderr(), 30, "two processes")
        n = 4000
        with SyncClient.from_config(load_config(cfg)) as client:
            client.publish_batch(Publish("items", f"k{i % 100}", {"seq": i}) for i in range(n))
        wait_until_sync(lambda: len(read_records([record])) >= 500, 30, "work under way")
        victim = live_children()[0]
        victim.kill()
        wait_until_sync(lambda: "died" in stderr(), 10, "the supervisor to notice")
        wait_until_sync(lambda: len({r[5] for r in read_records([record])}) >= n, 60,
                        "every message handled after the takeover")
        wait_until_sync(lambda: len(live_children()) == 2, 10, "a replacement process")
        assert victim.pid not in {c.pid for c in live_children()}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, stderr()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ids = [row[5] for row in read_records([record])]
    assert len(set(ids)) == n, "a message was lost"
    # At least once: only what the killed process had pulled and not acked comes again:
    # at most its cache (64) on each of the 4 queues it owned. (Slots bound handler calls,
    # not prefetch: the 8 slots do not bound what a process holds.)
    assert len(ids) - n <= 4 * 64


async def survivor_takes_over(
    redis_server: RedisServer, tmp_path: Path, min_processes: int,
    fault: Callable[[Supervisor, ChildProcess], Awaitable[None]],
) -> Supervisor:
    """Two real children with four queues each; ``fault`` kills the second. Then 800
    messages are published and the supervisor ticks until the first owns all 8
    queues; every message must be handled exactly once (none was pulled before)."""
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 8},
                       balancer={"lease_ttl_s": 1.5})
    record = tmp_path / "handled.rec"
    config = load_config(cfg)
    supervisor = Supervisor(
        "tests.apps.recorder:app", "rec", config,
        SupervisorSettings.from_config(config, min_processes, 2),
        config_path=str(cfg), env={"CONVEYOR_TEST_RECORD": str(record)},
    )
    adapter = create_adapter("redis", config)
    n = 800
    try:
        await supervisor._spawn()
        await supervisor._spawn()
        await assign(supervisor.children, range(8))
        survivor, victim = supervisor.children
        assert len(survivor.queues) == len(victim.queues) == 4
        await fault(supervisor, victim)
        async with Client.from_config(config) as client:
            await client.publish_batch(Publish("items", f"k{i % 50}", {"seq": i})
                                       for i in range(n))

        async def adopted() -> bool:
            await supervisor.tick(adapter)
            return supervisor.children == [survivor] and survivor.queues == set(range(8))

        await wait_until(adopted, 20, 0.2, "the dead child's queues adopted by the survivor")
        await wait_until(lambda: len(read_records([record])) >= n, 30, what="all handled")
    finally:
        await asyncio.gather(*(c.stop(30) for c in supervisor.children))
        await adapter.close()
    ids = [row[5] for row in read_records([record])]
    assert len(ids) == n and len(set(ids)) == n, "lost or duplicated"
    assert supervisor.stats.replaced == 1
    return supervisor


async def test_a_process_dying_while_its_queues_move_leaves_no_queue_unowned(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the children import tests.apps.recorder

    async def die_during_scale_down(supervisor: Supervisor, victim: ChildProcess) -> None:
        assert victim.proc is not None
        victim.proc.kill()  # dies as the scale-down starts moving its queues
        with pytest.raises(ChildGone):
            await asyncio.wait_for(supervisor._scale_down([0, 0]), 10)

    await survivor_takes_over(redis_server, tmp_path, 1, die_during_scale_down)


async def test_a_replacement_that_fails_to_start_does_not_strand_the_dead_ones_queues(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)

    async def die_and_break_spawning(supervisor: Supervisor, victim: ChildProcess) -> None:
        assert victim.proc is not None
        victim.proc.kill()
        supervisor.app_path = "tests.apps.no_such_module:app"  # replacements cannot start

    supervisor = await survivor_takes_over(redis_server, tmp_path, 2, die_and_break_spawning)
    assert supervisor.stats.errors >= 1  # each failed replacement was logged and retried


def test_a_supervisor_whose_redis_is_down_at_start_ends_with_a_message(tmp_path: Path) -> None:
    # Nothing listens on port 1: the child starts owning nothing (its balancer joins in
    # the background), but cannot take the queues the supervisor gives it, and the
    # supervisor's start gives up with the reason rather than a traceback.
    cfg = write_config(tmp_path / "c.toml", "redis://127.0.0.1:1/0",
                       redis={"retry_max_s": 0.5, "connect_timeout_s": 0.2})
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
         "--config", str(cfg), "--processes", "1:2"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("conveyor: error: process #1 could not acquire queue"), done.stderr
    assert "redis unreachable" in last
    assert "Traceback" not in done.stderr, done.stderr


async def test_a_process_dying_as_the_queues_are_first_assigned_is_replaced_not_fatal(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that dies while the supervisor first hands out the queues (a message that
    kills its worker, at the head of a backlog) is replaced and its queues adopted, as an
    inspection would; before, the ChildGone ended the whole worker. Here the second
    child is killed as the first queue is sent to it (a child that is dead before the
    assignment is simply given nothing); then every one of 800 messages published is
    handled exactly once (none was pulled before)."""
    monkeypatch.chdir(REPO)  # the children import tests.apps.recorder
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 8},
                       balancer={"lease_ttl_s": 1.5})
    record = tmp_path / "handled.rec"
    config = load_config(cfg)
    supervisor = Supervisor(
        "tests.apps.recorder:app", "rec", config, SupervisorSettings.from_config(config, 2, 2),
        config_path=str(cfg), env={"CONVEYOR_TEST_RECORD": str(record)},
    )
    spawn = supervisor._spawn
    killed: list[ChildProcess] = []

    async def spawn_and_kill_the_second() -> ChildProcess:
        child = await spawn()
        if len(supervisor.children) == 2 and not killed:
            acquire = child.acquire

            async def killed_on_acquiring(queue: int) -> None:
                if not killed:
                    assert child.proc is not None
                    child.proc.kill()
                    killed.append(child)
                await acquire(queue)

            monkeypatch.setattr(child, "acquire", killed_on_acquiring)
        return child

    monkeypatch.setattr(supervisor, "_spawn", spawn_and_kill_the_second)
    stop = asyncio.Event()
    ready: list[str] = []
    running = asyncio.create_task(supervisor.run(stop, ready.append))
    n = 800
    try:
        await wait_until(lambda: bool(ready) or running.done(), 30, what="the first start")
        assert not running.done(), running.exception()  # the death did not end the start
        assert killed and killed[0] not in supervisor.children
        assert supervisor.processes == 2 and supervisor.stats.replaced == 1
        assert set().union(*(c.queues for c in supervisor.children)) == set(range(8))
        async with Client.from_config(config) as client:
            await client.publish_batch(Publish("items", f"k{i % 50}", {"seq": i})
                                       for i in range(n))
        await wait_until(lambda: len(read_records([record])) >= n, 30, what="all handled")
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)
    ids = [row[5] for row in read_records([record])]
    assert len(ids) == n and len(set(ids)) == n, "lost or duplicated"


@pytest.mark.parametrize(("level", "child_info"), [("warning", False), ("info", True)])
def test_the_children_log_at_the_level_the_cli_was_given(
    redis_server: RedisServer, tmp_path: Path, level: str, child_info: bool
) -> None:
    # The children read their level from the environment the supervisor gives them: with
    # no --log-level reaching them, `--log-level warning` still printed their INFO lines.
    cfg = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 2})
    err_path = tmp_path / "supervisor.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "--log-level", level, "worker",
             "tests.apps.recorder:app", "--config", str(cfg), "--processes", "1:2"],
            cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1",
                               CONVEYOR_TEST_RECORD=str(tmp_path / "handled.rec")),
            stdout=subprocess.DEVNULL, stderr=err,
        )
    try:
        wait_until_sync(lambda: "ready" in err_path.read_text(errors="replace"), 30,
                        "the first process")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = err_path.read_text(errors="replace")
    assert "Traceback" not in log, log
    child_lines = re.findall(r"^\S+ \S+ (\w+) \[child \d+\]", log, re.M)
    assert ("INFO" in child_lines) is child_info, log


def test_processes_run_a_config_given_as_a_pipe_each_child_reading_the_parents_text(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # `--config <(...)` is /dev/fd/N of the shell's pipe: the children, reading the path
    # again, found no such file (fds are not inherited) or an empty pipe (read once).
    text = write_config(tmp_path / "c.toml", redis_server.url, slots={"count": 8},
                        balancer={"kind": "static"}).read_bytes()
    record = tmp_path / "handled.rec"
    read_fd, write_fd = os.pipe()
    os.write(write_fd, text)  # a few hundred bytes: the pipe's buffer holds them
    os.close(write_fd)
    err_path = tmp_path / "supervisor.err"
    env = dict(os.environ, PYTHONUNBUFFERED="1", CONVEYOR_TEST_RECORD=str(record))
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
             "--config", f"/dev/fd/{read_fd}", "--processes", "2:2"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(read_fd,),
        )
    os.close(read_fd)

    def stderr() -> str:
        return err_path.read_text(errors="replace")

    n = 400
    with reaped(proc):
        wait_until_sync(lambda: "2 process(es) own 8 queue(s)" in stderr()
                        or proc.poll() is not None, 60, "two processes")
        assert proc.poll() is None, stderr()
        with SyncClient.from_config(load_config(tmp_path / "c.toml")) as client:
            client.publish_batch(Publish("items", f"k{i % 40}", {"seq": i}) for i in range(n))
        wait_until_sync(lambda: len(read_records([record])) >= n, 60, "every message handled")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, stderr()
    rows = read_records([record])
    assert sorted(int(row[4]) for row in rows) == list(range(n)), "lost or duplicated"
    assert len({row[1] for row in rows}) == 2, "both processes should have worked"
    assert "Traceback" not in stderr(), stderr()
