"""`conveyor worker --http-port` on a real redis-server: a daemon's /metrics and probes,
a daemon started while Redis is down (not ready until it joins), and the supervisor's
one endpoint in front of its children (`--processes`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import Publish, load_config
from conveyor.client import SyncClient
from tests.conftest import free_port, wait_until_sync
from tests.http_scrape import get, scrape, value
from tests.integration.redis.conftest import REPO, RedisServer, read_records, write_config

pytestmark = pytest.mark.redis


class Proc:
    """A `conveyor worker tests.apps.recorder:app --http-port P ...` subprocess."""

    def __init__(self, tmp: Path, config: Path, port: int, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.record = tmp / "handled.rec"
        self.err = tmp / "worker.err"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
                 "--config", str(config), "--http-port", str(port), *args],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "CONVEYOR_TEST_RECORD": str(self.record),
                     "CONVEYOR_HTTP__HOST": "127.0.0.1", **(env or {})},
            )

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def handled(self) -> list[str]:
        return [row[5] for row in read_records([self.record])]

    def stop(self) -> None:
        """SIGTERM; a clean exit within 60 s."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0, self.stderr
        assert "Traceback" not in self.stderr, self.stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in started:
            p.kill()


def publish(config: Path, n: int) -> None:
    """Items 0..n-1 on 40 streams; a test then expects exactly these seqs handled."""
    with SyncClient.from_config(load_config(config)) as client:
        tokens = client.publish_batch(
            Publish("items", f"k{i % 40}", {"seq": i}) for i in range(n)
        )
    assert len(tokens) == n


def seqs(p: Proc) -> list[int]:
    return [row[4] for row in read_records([p.record])]


def test_a_redis_daemon_serves_its_metrics_and_probes(
    redis_server: RedisServer, tmp_path: Path, procs: list[Proc]
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    port, n = free_port(), 400
    p = Proc(tmp_path, cfg, port, env={"CONVEYOR_TELEMETRY__METRICS_INTERVAL_S": "0.2"})
    procs.append(p)
    wait_until_sync(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")
    publish(cfg, n)
    wait_until_sync(lambda: len(seqs(p)) >= n, 30, f"{n} handled")

    def lag_is_zero() -> bool:
        samples = scrape(port)[1]
        lags = [v for (name, _), v in samples.items() if name == "conveyor_queue_lag"]
        return len(lags) == 8 and sum(lags) == 0

    wait_until_sync(lag_is_zero, 10, "the lag of all 8 queues sampled at 0")
    _, samples = scrape(port)
    assert value(samples, "conveyor_messages_handled_total") == n
    assert value(samples, "conveyor_queues_owned") == 8
    assert get(port, "/healthz") == (200, "ok\n")
    p.stop()
    # Exactly what was published was handled, once each: nothing stopped mid-run.
    assert sorted(seqs(p)) == list(range(n))


def test_a_daemon_started_while_redis_is_down_is_not_ready_until_it_joins(
    redis_server: RedisServer, tmp_path: Path, procs: list[Proc]
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url,
                       redis={"retry_max_s": 0.5, "retry_max_delay_s": 0.1})
    redis_server.stop()
    port = free_port()
    p = Proc(tmp_path, cfg, port)
    procs.append(p)
    # Alive (the loop answers) but not ready: starting, then started without a membership.
    wait_until_sync(lambda: get(port, "/healthz")[0] == 200, 30, "/healthz 200")
    wait_until_sync(lambda: "owns queues []" in p.stderr, 30, "a start that owns nothing")
    status, body = get(port, "/readyz")
    assert (status, body) == (503, "not ready: not joined yet (membership or consumer group "
                                    "unreachable?)\n"), p.stderr
    redis_server.start()
    wait_until_sync(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200 once joined")
    n = 50
    publish(cfg, n)
    wait_until_sync(lambda: len(seqs(p)) >= n, 30, f"{n} handled")
    p.stop()
    assert sorted(seqs(p)) == list(range(n))


@pytest.mark.slow
def test_the_supervisor_serves_one_endpoint_with_every_childs_metrics_labelled(
    redis_server: RedisServer, tmp_path: Path, procs: list[Proc]
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url, balancer={"kind": "static"})
    port, n = free_port(), 400
    p = Proc(tmp_path, cfg, port, "--processes", "2:2")
    procs.append(p)
    wait_until_sync(lambda: get(port, "/readyz")[0] == 200, 60, "/readyz 200")
    publish(cfg, n)
    wait_until_sync(lambda: len(seqs(p)) >= n, 30, f"{n} handled")
    families, samples = scrape(port)
    assert value(samples, "conveyor_supervisor_processes") == 2
    per_process = {
        dict(labels)["process"]: v for (name, labels), v in samples.items()
        if name == "conveyor_messages_handled_total"
    }
    assert len(per_process) == 2 and sum(per_process.values()) == n, per_process
    owned = [v for (name, _), v in samples.items() if name == "conveyor_queues_owned"]
    assert sorted(owned) == [4, 4]
    assert "conveyor_handler_duration_seconds" in families
    assert get(port, "/healthz") == (200, "ok\n")
    p.proc.send_signal(signal.SIGTERM)  # 503 during a drain: tests/e2e/test_http_endpoint.py
    assert p.proc.wait(60) == 0, p.stderr
    assert "Traceback" not in p.stderr
    # Every message handled once: the processes split the queues, nothing moved.
    assert sorted(seqs(p)) == list(range(n))


def test_the_supervisors_port_in_use_is_a_usage_error_naming_the_option(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
             "--config", str(cfg), "--http-port", str(port), "--processes", "1:1"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={**os.environ, "CONVEYOR_TEST_RECORD": str(tmp_path / "handled.rec"),
                 "CONVEYOR_HTTP__HOST": "127.0.0.1"})
    assert result.returncode == 2, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("conveyor:")]
    assert line.startswith("conveyor: error: Invalid value for --http-port: cannot listen "
                           f"on 127.0.0.1:{port} "), line
