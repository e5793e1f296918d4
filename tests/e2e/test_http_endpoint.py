"""`conveyor worker --http-port`: /metrics, /healthz and /readyz of a real worker process
on the memory adapter (the Redis ones are in tests/integration/redis/test_redis_http.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port, stop_when, wait_until_sync
from tests.http_scrape import get, scrape, value
from tests.otlp import Receiver, otlp_receiver

__all__ = ["otlp_receiver"]  # the fixture, used by name below

ROOT = Path(__file__).resolve().parents[2]
DRAINED = re.compile(r"drained pulled=(\d+) acked=(\d+) handled=(\d+) dead_lettered=(\d+) "
                     r"abandoned=(\d+) skipped=(\d+) released=(\d+)")


def start_worker(tmp_path: Path, port: int, *, messages: int, work_ms: float,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVEYOR_TEST_OUT": str(tmp_path / "handled.txt"),
           "CONVEYOR_TEST_MESSAGES": str(messages), "CONVEYOR_TEST_WORK_MS": str(work_ms),
           **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.drain_app:app",
         "--config", "configs/local.toml", "--http-port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def handled_ids(tmp_path: Path) -> list[str]:
    path = tmp_path / "handled.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def published_ids(tmp_path: Path) -> set[str]:
    return set((tmp_path / "handled.txt.published").read_text().split())


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, a clean exit, its stderr."""
    stderr = stop_when(proc, lambda: True, 1, "nothing")
    assert "Traceback" not in stderr, stderr
    return stderr


def prometheus_name(name: str, unit: str) -> str:
    """The OpenTelemetry -> Prometheus name rule for Conveyor's instruments."""
    return name.replace(".", "_") + ("_seconds" if unit == "s" else "")


def test_metrics_has_the_otlp_metric_set_and_counts_what_the_worker_handled(
    tmp_path: Path, otlp_receiver: tuple[str, Receiver]
) -> None:
    endpoint, received = otlp_receiver
    port, n = free_port(), 300
    proc = start_worker(tmp_path, port, messages=n, work_ms=1, extra_env={
        "CONVEYOR_TELEMETRY__EXPORTER": "otlp", "CONVEYOR_TELEMETRY__ENDPOINT": endpoint,
        "CONVEYOR_TELEMETRY__METRICS_INTERVAL_S": "0.2",
    })
    try:
        wait_until_sync(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")
        assert get(port, "/readyz") == (200, "ready\n")
        assert get(port, "/healthz") == (200, "ok\n")
        wait_until_sync(lambda: len(handled_ids(tmp_path)) == n, 30, f"{n} handled")
        families, samples = scrape(port)
        assert get(port, "/nope")[0] == 404
        # An export while the queues are owned (the one at shutdown comes after the drain,
        # when per-queue gauges have no queue left to report).
        exported = len(received.metrics)
        wait_until_sync(lambda: len(received.metrics) > exported, 10, "an OTLP export")
    finally:
        stderr = stop(proc)  # flushes the OTLP export: every instrument once more
    # Exactly what was published was handled, once each (no drain is under way: none
    # may be repeated).
    handled = handled_ids(tmp_path)
    assert len(handled) == len(set(handled)) == n and set(handled) == published_ids(tmp_path)
    assert value(samples, "conveyor_messages_handled_total") == n
    assert value(samples, "conveyor_handler_duration_seconds_count",
                 messaging_destination_name="jobs") == n
    assert value(samples, "conveyor_messages_dead_lettered_total") == 0
    assert value(samples, "conveyor_queues_owned") == 8
    # Seconds, with buckets that tell a 1 ms handler from a 100 ms one.
    assert value(samples, "conveyor_handler_duration_seconds_bucket", le="0.0005") < n
    assert value(samples, "conveyor_handler_duration_seconds_bucket", le="0.1") == n
    member = re.search(r"worker (\S+) ready", stderr)
    assert member is not None
    assert value(samples, "target_info", service_instance_id=member.group(1)) == 1
    # The same metric set as the OTLP export (the Prometheus families carry no _total).
    otlp = {prometheus_name(m.name, m.unit) for _, m in received.metrics}
    assert otlp, "nothing was exported over OTLP"
    assert families - {"target_info"} == otlp
    match = DRAINED.search(stderr)
    assert match is not None and int(match.group(3)) == n


def test_readyz_turns_503_while_the_worker_drains_and_healthz_stays_200(
    tmp_path: Path,
) -> None:
    port, n = free_port(), 20
    # 20 streams, 3 s per call: all 20 calls run at once, and a drain waits ~3 s for them.
    proc = start_worker(tmp_path, port, messages=n, work_ms=3000)
    try:
        wait_until_sync(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")

        def running() -> float:
            return value(scrape(port)[1], "conveyor_slots_in_use", handler="*")

        wait_until_sync(lambda: running() == n, 10, f"{n} handler calls running")
        proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: get(port, "/readyz")[0] == 503, 2, "/readyz 503")
        assert get(port, "/readyz") == (503, "not ready: draining\n")
        assert get(port, "/healthz") == (200, "ok\n")
        assert running() > 0, "the drain should still be waiting for the handlers"
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    # The drain let every call under way finish: all 20 handled, once each, none lost.
    handled = handled_ids(tmp_path)
    assert len(handled) == len(set(handled)) == n and set(handled) == published_ids(tmp_path)
    match = DRAINED.search(stderr)
    assert match is not None, stderr
    assert match.group(3) == str(n) and match.group(5) == "0"  # handled, abandoned
    assert get(port, "/healthz")[0] == 0, "the endpoint closes with the worker"


@pytest.mark.parametrize("given", ["--http-port", "CONVEYOR_HTTP__PORT", "config file"])
def test_a_port_that_cannot_be_bound_exits_2_with_one_line_naming_where_it_was_given(
    tmp_path: Path, given: str,
) -> None:
    # It named `$.http.port`, the config field, for a port given as `--http-port` too.
    config = tmp_path / "http.toml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config.write_text(f"[http]\nhost = '127.0.0.1'\nport = {port}\n")
        host = {"CONVEYOR_HTTP__HOST": "127.0.0.1"}
        args, env = {
            "--http-port": (["--http-port", str(port)], host),
            "CONVEYOR_HTTP__PORT": ([], {**host, "CONVEYOR_HTTP__PORT": str(port)}),
            "config file": (["--config", str(config)], {}),
        }[given]
        result = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.drain_app:app", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, **env,
                 "CONVEYOR_TEST_OUT": str(tmp_path / "out"), "CONVEYOR_TEST_MESSAGES": "0"},
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("conveyor:")]
    where = {
        "--http-port": "Invalid value for --http-port: ",
        "CONVEYOR_HTTP__PORT": "config: environment variable CONVEYOR_HTTP__PORT: "
                               "$.http.port: ",
        "config file": f"config: {config}: $.http.port: ",
    }[given]
    assert line.startswith(f"conveyor: error: {where}cannot listen on 127.0.0.1:{port} "
                           "(Address already in use); choose another port"), line
    assert "daemon" not in result.stderr  # it failed before the daemon started


def test_a_bad_http_port_is_a_usage_error() -> None:
    for args, env, field in [
        (["--http-port", "0"], {}, "--http-port"),
        (["--http-port", "70000"], {}, "--http-port"),
        ([], {"CONVEYOR_HTTP__PORT": "70000"}, "$.http.port"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.drain_app:app", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )
        assert result.returncode == 2 and field in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
