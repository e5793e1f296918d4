"""Stop means stop: `conveyor worker` on Redis (the shipped configs/redis.toml, the
server's address changed) exits within drain_timeout_s of SIGTERM (+ 2 s), whatever its
handlers and cache are doing; a second signal stops it at once; a signal during the start
stops it too. Nothing is lost: the next owner handles everything left unacknowledged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conveyor import Client, Publish, load_config
from tests.conftest import free_port, wait_until, wait_until_sync
from tests.integration.redis.conftest import REPO
from tests.servers import RedisServer

GROUP = "stop-test"


def config_file(tmp: Path, url: str, **fields: Any) -> Path:
    """configs/redis.toml with ``url`` and ``section__field=value`` changed."""
    raw = msgspec.toml.decode((REPO / "configs" / "redis.toml").read_bytes())
    raw["redis"]["url"] = url
    for key, value in fields.items():
        section, _, field = key.partition("__")
        raw.setdefault(section, {})[field] = value
    path = tmp / "c.toml"
    path.write_text("".join(
        f"[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
        for section, values in raw.items()
    ))
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def start_worker(config: Path, out: Path, work_ms: float, app: str = "app"
                 ) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_WORK_MS": str(work_ms)}
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", f"tests.apps.stop_app:{app}",
         "--config", str(config)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def publish(config: Path, keys: int, per_key: int) -> int:
    import asyncio

    async def run() -> None:
        async with Client.from_config(load_config(config)) as client:
            await client.publish_batch([
                Publish("jobs", f"k{k}", {"seq": k * per_key + i})
                for k in range(keys) for i in range(per_key)
            ])

    asyncio.run(run())
    return keys * per_key


def pending(server: RedisServer) -> int:
    client = server.client()
    total = 0
    for q in range(8):
        if client.exists(f"conveyor:q:{q}"):
            groups = [g["name"] for g in client.xinfo_groups(f"conveyor:q:{q}")]
            if GROUP.encode() in groups:
                total += client.xpending(f"conveyor:q:{q}", GROUP)["pending"]
    return total


def stop_and_time(proc: subprocess.Popen[str], twice: bool = False) -> tuple[float, str]:
    """SIGTERM (``twice``: again once the worker says it is draining); the seconds from
    the first signal until the process exited, and its stderr."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    seen = ""
    if twice:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen += line
            if "draining" in line:
                break
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - t0, seen + err


def handled_once_by_next_owner(config: Path, out: Path, published: int) -> None:
    """A second worker with fast handlers handles everything: nothing was lost."""
    proc = start_worker(config, out, 0)
    try:
        wait_until_sync(lambda: out.exists() and len(out.read_text().splitlines()) >= published,
                        60, what=f"{published} handled by the next owner")
    finally:
        _, err = stop_and_time(proc)
    assert proc.returncode == 0, err
    seqs = [int(line.split()[1]) for line in out.read_text().splitlines()]
    assert sorted(seqs) == list(range(published))  # every message, exactly once


def drained_line(err: str) -> str:
    return next(line for line in err.splitlines() if "drained" in line)


@pytest.mark.parametrize(
    ("fields", "keys", "pulled", "running", "twice", "within_s"),
    [
        # One stream, a stuck handler: the agent's cache (16) fills, its pull waits for room.
        ({"worker__drain_timeout_s": 3, "worker__cache_capacity": 16}, 1, 16, 1, False, 3 + 2),
        # Four slots, four stuck handlers on four of eight streams: the rest wait for a slot.
        ({"worker__drain_timeout_s": 2, "slots__count": 4}, 8, 200, 4, False, 2 + 2),
        # A long drain timeout, and a second signal: no waiting for the handlers at all.
        ({"worker__drain_timeout_s": 60, "worker__cache_capacity": 16}, 1, 16, 1, True, 2),
    ],
    ids=["full-cache", "every-slot-busy", "second-signal"],
)
def test_a_stuck_worker_exits_in_time_and_the_next_owner_gets_everything(
    redis_server: RedisServer, tmp_path: Path, fields: dict[str, Any], keys: int, pulled: int,
    running: int, twice: bool, within_s: float,
) -> None:
    config = config_file(tmp_path, redis_server.url, **fields)
    published = publish(config, keys=keys, per_key=200 // keys)
    out = tmp_path / "out"
    started = tmp_path / "out.started"
    proc = start_worker(config, out, work_ms=600_000)
    try:
        wait_until_sync(lambda: pending(redis_server) == pulled
                        and started.exists() and len(started.read_text().split("\n")) > running,
                        30, what=f"{pulled} pulled, {running} stuck handler call(s)")
    finally:
        elapsed, err = stop_and_time(proc, twice=twice)
    assert proc.returncode == 0, err
    assert elapsed < within_s, f"exit took {elapsed:.1f}s after the first signal"
    # The stuck calls are abandoned; what no handler started is handed back unstarted.
    assert f"abandoned={running} " in drained_line(err)
    assert f"released={pulled - running}" in drained_line(err)
    assert ("second stop signal" in err) is twice
    handled_once_by_next_owner(config, out, published)


@pytest.mark.parametrize(
    ("app", "work_ms", "thread", "abandoned"),
    [("to_thread_app", 600_000, "asyncio_0", 1), ("thread_app", 0, "app-poller", 0)],
    ids=["handler-in-to-thread", "app-thread"],
)
def test_a_thread_that_never_returns_does_not_keep_the_worker_alive(
    redis_server: RedisServer, tmp_path: Path, app: str, work_ms: int, thread: str,
    abandoned: int,
) -> None:
    # Python waits at exit for threads that are not daemon threads: a handler's
    # asyncio.to_thread call stuck for good kept `conveyor worker` alive after its
    # drain (in asyncio.run's executor shutdown, before the drained line), and so did a
    # thread the app started; the worker exits past them, naming them.
    config = config_file(tmp_path, redis_server.url, worker__drain_timeout_s=2)
    published = publish(config, keys=1, per_key=100)
    out, started = tmp_path / "out", tmp_path / "out.started"
    proc = start_worker(config, out, work_ms=work_ms, app=app)
    try:  # the stuck call started, or every message handled
        wait_until_sync(lambda: started.exists() and len(started.read_text().splitlines())
                        == (1 if abandoned else published), 30, what="the handlers' calls")
        if app == "thread_app":  # its startup hook runs beside the handlers (failed once
            # under load: all 100 handled and the worker stopped before the hook ran)
            wait_until_sync(lambda: (tmp_path / "out.poller").exists()
                            and bool((tmp_path / "out.poller").read_text()), 30,
                            what="the app's thread")
    finally:
        elapsed, err = stop_and_time(proc)
    assert proc.returncode == 0, err
    assert elapsed < 2 + 2, f"exit took {elapsed:.1f}s after the signal"
    assert f"abandoned={abandoned} " in drained_line(err)
    assert f"exiting without waiting for 1 thread(s) still running after the stop: {thread} " in err
    if abandoned:
        handled_once_by_next_owner(config, out, published)


def test_an_idle_worker_with_a_long_poll_exits_at_once(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    # A pull blocked on an idle queue for a minute is cancelled, not waited for.
    config = config_file(tmp_path, redis_server.url, worker__poll_timeout_ms=60_000,
                         redis__socket_timeout_s=120)
    proc = start_worker(config, tmp_path / "out", work_ms=0)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker's log, until it says it is ready
            if "ready" in line:
                break
        client = redis_server.client()
        wait_until_sync(lambda: client.info("clients")["blocked_clients"] == 8, 10,
                        what="every agent in its blocking read")
    finally:
        elapsed, err = stop_and_time(proc)
    assert proc.returncode == 0, err
    assert elapsed < 2, f"exit took {elapsed:.1f}s"


def test_a_signal_while_starting_stops_the_worker(tmp_path: Path) -> None:
    # Nothing listens on the port: the start waits for Redis (retry_max_s = 10 s).
    config = config_file(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    proc = start_worker(config, tmp_path / "out", work_ms=0)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker's log, until it says it waits for Redis
            if "unreachable" in line:
                break
        assert proc.poll() is None
    finally:
        elapsed, err = stop_and_time(proc)
    assert proc.returncode == 0, err
    assert elapsed < 2, f"exit took {elapsed:.1f}s"


async def test_a_daemons_stop_during_its_start_ends_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # WorkerDaemon.stop() while start() still waited for an unreachable Redis returned at
    # once, but the start went on in the background ("still waiting for redis ... down
    # for 10s, 15s"), and would have joined, taken queues and run the startup hooks on
    # a daemon whose parts the stop had closed, had Redis answered.
    import asyncio

    from conveyor import App, ShutdownError, WorkerDaemon

    app = App("stop-while-starting")
    hooks: list[object] = []

    @app.startup
    async def hook(client: Client) -> None:
        hooks.append(client)

    config = load_config(REPO / "configs" / "redis.toml", environ={}, overrides={
        "redis": {"url": f"redis://127.0.0.1:{free_port()}/0"}})
    daemon = WorkerDaemon(app, config)
    starting = asyncio.ensure_future(daemon.start())
    await wait_until(lambda: "unreachable" in caplog.text, what="the start's Redis retries")
    assert not starting.done() and daemon.readiness() == "starting"
    report = await asyncio.wait_for(daemon.stop(), 15)  # 5 s once ran out at load 9
    assert starting.done()
    with pytest.raises(ShutdownError) as stopped:
        starting.result()
    assert str(stopped.value) == "this WorkerDaemon was stopped while it started"
    assert report.pulled == 0 and hooks == [] and not daemon.started
