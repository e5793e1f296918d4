"""The HTTP endpoint in-process, on a real socket: what each path answers, bad requests,
a daemon's readiness through its life, and the supervisor's merge of its children."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor import load_config
from conveyor.platform.errors import ConfigError
from conveyor.platform.telemetry import Telemetry
from conveyor.workers import http_endpoint
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.http_endpoint import HttpEndpoint, daemon_endpoint
from conveyor.workers.supervisor.endpoint import merge, supervisor_endpoint
from conveyor.workers.supervisor.process import ChildProcess
from conveyor.workers.supervisor.scaler import SupervisorSettings
from conveyor.workers.supervisor.supervisor import Supervisor
from tests.conftest import free_port, wait_until
from tests.integration.memory_harness import Record, fresh_adapter, recording_app


async def request(port: int, raw: bytes) -> tuple[str, str]:
    """Send ``raw`` and end the sending side; the status line and the body of the answer
    ('' when closed unanswered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    writer.write_eof()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), body.decode()


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def test_each_path_answers_and_bad_requests_get_no_traceback() -> None:
    reasons: list[str | None] = ["starting"]

    async def failing_metrics() -> bytes:
        raise RuntimeError("a callback broke")

    endpoint = HttpEndpoint("127.0.0.1", 0, metrics=failing_metrics,
                            readiness=lambda: reasons[0])
    await endpoint.start()
    port = endpoint.port
    try:
        assert port != 0
        assert await request(port, get("/healthz")) == ("HTTP/1.1 200 OK", "ok\n")
        assert await request(port, get("/readyz")) == (
            "HTTP/1.1 503 Service Unavailable", "not ready: starting\n")
        reasons[0] = None
        assert await request(port, get("/readyz?verbose=1")) == ("HTTP/1.1 200 OK", "ready\n")
        assert await request(port, get("/healthz", "HEAD")) == ("HTTP/1.1 200 OK", "")
        assert (await request(port, get("/metrics")))[0] == "HTTP/1.1 500 Internal Server Error"
        assert (await request(port, get("/metrics", "POST")))[0] == (
            "HTTP/1.1 405 Method Not Allowed")
        assert (await request(port, get("/")))[0] == "HTTP/1.1 404 Not Found"
        # Not a request: a one-line 4xx saying why (closed unanswered, as these were,
        # curl says "empty reply from server", as if the worker had crashed).
        bad = ("HTTP/1.1 400 Bad Request",
               "bad request: expected a request line such as GET /metrics HTTP/1.1\n")
        assert await request(port, b"NONSENSE\r\n\r\n") == bad
        assert await request(port, b"GET /a b HTTP/1.1\r\n\r\n") == bad
        assert await request(port, b"GET /healthz HTTP/1.1\r\nHost: x") == bad  # then EOF
        too_large = ("HTTP/1.1 431 Request Header Fields Too Large",
                     "request head over 8,192 bytes\n")
        for size in (9000, 70_000):  # over the bound; over the stream reader's own 64 KiB
            assert await request(port, b"GET /healthz HTTP/1.1\r\nX: " + b"y" * size
                                 + b"\r\n\r\n") == too_large
        assert await request(port, b"") == ("", "")  # a port check: closed, unanswered
        # Still serving after all that.
        assert await request(port, get("/healthz")) == ("HTTP/1.1 200 OK", "ok\n")
    finally:
        await endpoint.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_head_that_does_not_end_in_time_gets_a_408(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_endpoint, "REQUEST_TIMEOUT_S", 0.5)
    endpoint = HttpEndpoint("127.0.0.1", 0, metrics=_no_metrics, readiness=lambda: None)
    await endpoint.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(b"GET /healthz HTTP/1.1\nHost: x\n\n")  # bare LFs: never a whole head
        answered = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answered.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answered
        assert answered.endswith(b"\r\n\r\nno whole request head within 0.5 s\n"), answered
    finally:
        await endpoint.close()


async def test_a_port_in_use_is_a_config_error_naming_the_field() -> None:
    first = HttpEndpoint("127.0.0.1", 0, metrics=_no_metrics, readiness=lambda: None)
    await first.start()
    try:
        second = HttpEndpoint("127.0.0.1", first.port, metrics=_no_metrics,
                              readiness=lambda: None)
        with pytest.raises(ConfigError, match=r"^\$\.http\.port: cannot listen on 127\.0\.0\.1"):
            await second.start()
    finally:
        await first.close()


async def _no_metrics() -> bytes:
    return b""


async def test_a_daemons_readiness_is_starting_ready_then_draining() -> None:
    record = Record()
    config = load_config(overrides={"http": {"port": 9}, "worker": {"drain_timeout_s": 5}})
    daemon = WorkerDaemon(recording_app(record, delay_s=0.5), config, adapter=fresh_adapter())
    endpoint = daemon_endpoint(daemon, "127.0.0.1", 0)
    await endpoint.start()
    try:
        assert daemon.readiness() == "starting"
        await daemon.start()
        assert daemon.readiness() is None
        assert (await request(endpoint.port, get("/readyz")))[1] == "ready\n"
        await daemon.client.publish("items", "k", {"seq": 1})
        await wait_until(lambda: record.active == 1, 5, what="the handler running")
        stopping = asyncio.create_task(daemon.stop())
        await wait_until(lambda: daemon.readiness() == "draining", 1, what="draining")
        assert await request(endpoint.port, get("/readyz")) == (
            "HTTP/1.1 503 Service Unavailable", "not ready: draining\n")
        assert record.active == 1  # the drain is still waiting for the handler
        report = await stopping
    finally:
        await endpoint.close()
    assert (report.handled, report.abandoned, record.handled, record.duplicates) == (1, 0, 1, 0)


def test_the_supervisor_merges_families_and_labels_each_childs_series() -> None:
    own = ("# HELP conveyor_supervisor_processes p\n# TYPE conveyor_supervisor_processes gauge\n"
           "conveyor_supervisor_processes 2.0\n")
    child = ("# HELP conveyor_messages_handled_total h\n"
             "# TYPE conveyor_messages_handled_total counter\n"
             "conveyor_messages_handled_total {n}\n"
             "# HELP conveyor_queue_lag l\n# TYPE conveyor_queue_lag gauge\n"
             'conveyor_queue_lag{{queue="{q}"}} 0.0\n')
    text = merge(own, [(1, child.format(n=3.0, q=0)), (4, child.format(n=5.0, q=1))]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # valid exposition
    assert text.count("# TYPE conveyor_messages_handled_total counter") == 1
    handled = {s.labels["process"]: s.value
               for s in families["conveyor_messages_handled"].samples}
    assert handled == {"1": 3.0, "4": 5.0}
    lag = [s.labels for s in families["conveyor_queue_lag"].samples]
    assert lag == [{"queue": "0", "process": "1"}, {"queue": "1", "process": "4"}]
    [own_sample] = families["conveyor_supervisor_processes"].samples
    assert own_sample.labels == {} and own_sample.value == 2.0


async def test_the_supervisors_metrics_leave_out_a_silent_child_and_still_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = load_config(overrides={"queues": {"adapter": "redis"},
                                    "balancer": {"membership": "redis"}, "http": {"port": 9}})
    telemetry = Telemetry.from_config(config.telemetry, prometheus=True)
    supervisor = Supervisor("x:app", "x", config, SupervisorSettings(1, 2), telemetry=telemetry)

    async def child_metrics() -> bytes:
        return b"# TYPE conveyor_queues_owned gauge\nconveyor_queues_owned 4.0\n"

    answering = HttpEndpoint("127.0.0.1", 0, metrics=child_metrics, readiness=lambda: None)
    await answering.start()
    ok, silent = ChildProcess(1), ChildProcess(2)
    ok.alive = silent.alive = True
    ok.http_port, silent.http_port = answering.port, free_port()  # nobody listens there
    supervisor.children = [ok, silent]
    endpoint = supervisor_endpoint(supervisor, telemetry, "127.0.0.1", 0)
    await endpoint.start()
    try:
        status, body = await request(endpoint.port, get("/metrics"))
        assert await request(endpoint.port, get("/readyz")) == (
            "HTTP/1.1 503 Service Unavailable", "not ready: starting\n")
    finally:
        await endpoint.close()
        await answering.close()
        telemetry.shutdown()
    assert status == "HTTP/1.1 200 OK"
    families = {f.name: f for f in text_string_to_metric_families(body)}
    [owned] = families["conveyor_queues_owned"].samples
    assert owned.labels == {"process": "1"} and owned.value == 4.0
    assert [s.value for s in families["conveyor_supervisor_processes"].samples] == [2.0]
    assert "process #2 did not answer" in caplog.text
