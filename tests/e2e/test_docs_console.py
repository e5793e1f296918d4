"""The shell blocks of the docs, run as printed (tests/docs_blocks.py says how blocks are
marked).

Each block runs in one bash, in a directory laid out like a clone: ``.venv`` and
``configs`` linked in, and the tour's ``shop.py`` (README.md) beside them. A ``console``
block's ``$ command`` lines run one after another in that shell (a job one puts in the
background is still there for the next), and what each prints, stdout and stderr, must
be the lines shown under it, once masked as the tour masks them (a daemon's id, a
token's time). An ``sh`` block must exit 0. A block marked ``<!-- docs: redis -->`` gets
a redis-server of its own, named by ``CONVEYOR_REDIS__URL``; so does a Python block so
marked, run as a script. Port 9100, which the docs use for ``--http-port``, becomes a
free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.docs_blocks import ROOT, Block, blocks, console_steps
from tests.e2e.test_tour import masked, tour_blocks
from tests.servers import RedisServer

SEPARATOR = "\x1e"  # between two commands' output
RUN = blocks({"console", "sh", "bash"}, {"", "redis"})
SCRIPTS = blocks({"python"}, {"redis"})


def params(found: list[Block]) -> list[object]:
    """One test per block, marked ``redis`` when it needs one (``-m "not redis"``)."""
    return [pytest.param(b, id=b.where, marks=[pytest.mark.redis] if b.marker == "redis" else [])
            for b in found]


class Clone:
    """A directory as a user's clone looks, for one block."""

    def __init__(self, where: Path, redis: RedisServer | None) -> None:
        self.where = where
        (where / "configs").symlink_to(ROOT / "configs")
        (where / ".venv").symlink_to(Path(sys.executable).parent.parent)
        (where / "shop.py").write_text(tour_blocks()["shop.py"])
        # This checkout's code, whichever checkout the venv was installed from.
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if redis is not None:
            self.env["CONVEYOR_REDIS__URL"] = redis.url

    def bash(self, script: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Runs ``script``; whatever it left running is stopped when it returns."""
        proc = subprocess.Popen(["bash", "-c", script], cwd=self.where, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"timed out after {timeout_s}s:\n{out}") from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.fixture
def clone(request: pytest.FixtureRequest, tmp_path: Path) -> Clone:
    block: Block = request.param
    redis = request.getfixturevalue("redis_server") if block.marker == "redis" else None
    return Clone(tmp_path, redis)


def with_free_port(text: str, port: int) -> str:
    return text.replace("9100", str(port))


def test_the_docs_have_shell_blocks_that_run() -> None:
    assert len([b for b in RUN if b.lang == "console"]) >= 3


@pytest.mark.parametrize("clone", params(RUN), indirect=True)
def test_a_shell_block_runs_as_printed(clone: Clone, request: pytest.FixtureRequest) -> None:
    block: Block = request.node.callspec.params["clone"]
    port = free_port()
    if block.lang != "console":
        result = clone.bash("set -e\n" + with_free_port(block.body, port))
        assert result.returncode == 0, result.stdout
        return
    steps = console_steps(block.body)
    script = "".join(f"printf '{SEPARATOR}\\n'\n{with_free_port(step.command, port)}\n"
                     for step in steps) + "wait\n"  # a job left in the background: drained
    result = clone.bash(script)
    printed = result.stdout.split(f"{SEPARATOR}\n")[1:]
    assert len(printed) == len(steps), result.stdout
    for step, out in zip(steps, printed, strict=True):
        assert [masked(line) for line in out.splitlines()] == [
            masked(with_free_port(line, port)) for line in step.output
        ], f"{block.where}: $ {step.command}"


@pytest.mark.parametrize("clone", params(SCRIPTS), indirect=True)
def test_a_python_block_that_needs_a_redis_runs_as_a_script(
    clone: Clone, request: pytest.FixtureRequest
) -> None:
    block: Block = request.node.callspec.params["clone"]
    (clone.where / "block.py").write_text(block.body)
    result = clone.bash(".venv/bin/python block.py")
    assert result.returncode == 0, result.stdout
