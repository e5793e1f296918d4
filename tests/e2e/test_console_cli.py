"""`conveyor console` as docs/console.md starts it, on a real redis-server: it prints what
the page shows and serves; the embedded adapter is refused as `conveyor status` refuses
it; a --write console prints its token, or says where it comes from without printing it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_until_sync
from tests.docs_blocks import ROOT, blocks_of, console_steps
from tests.servers import RedisServer

pytestmark = pytest.mark.redis


def serve(argv: list[str], env: dict[str, str], port: int) -> tuple[str, str]:
    """Run the console until its page answers, stop it; what it printed."""
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def serving() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    return "conveyor console" in page.read().decode()
            except OSError:
                return False

        wait_until_sync(serving, 30, "the console's page")
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, err


def test_the_console_starts_as_the_docs_show(redis_server: RedisServer) -> None:
    (block,) = [b for b in blocks_of(ROOT / "docs" / "console.md") if b.lang == "console"]
    (step,) = console_steps(block.body)
    port = free_port()
    argv = [sys.executable, "-m", "conveyor.cli", *shlex.split(step.command)[1:]]
    out, err = serve(argv, {"CONVEYOR_REDIS__URL": redis_server.url,
                            "CONVEYOR_CONSOLE_PORT": str(port)}, port)
    shown = (out.replace(f":{port}/", ":8089/")
             .replace(redis_server.url, "redis://127.0.0.1:6379/0"))
    assert shown.splitlines() == step.output, err
    assert "Traceback" not in err, err


def test_a_write_console_prints_its_token_unless_it_comes_from_the_environment(
    redis_server: RedisServer,
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "conveyor.cli", "console", "--config",
            "configs/redis.toml", "--write", "--port", str(port)]
    env = {"CONVEYOR_REDIS__URL": redis_server.url, "CONVEYOR_CONSOLE_TOKEN": ""}
    out, _ = serve(argv, env, port)
    assert "write actions on: token " in out
    assert len(out.split("token ", 1)[1].split()[0]) >= 24
    out, _ = serve(argv, {**env, "CONVEYOR_CONSOLE_TOKEN": "from-the-env"}, port)
    assert "$CONVEYOR_CONSOLE_TOKEN" in out and "from-the-env" not in out


def test_the_embedded_adapter_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "console", "--config",
                           "configs/local.toml"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "memory adapter" in done.stderr and "Traceback" not in done.stderr


def test_a_token_no_request_can_carry_is_a_usage_error_that_does_not_print_it() -> None:
    """A token read from a secret file kept the file's last newline: no header can carry
    it, and the console started to answer every write action with a 403 asking for the
    token it was given."""
    for token in ["s3cret\n", " s3cret", "s3cret\t", "sécret", "s3\x01cret"]:
        done = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "console", "--config", "configs/redis.toml",
             "--write", "--port", str(free_port())],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "CONVEYOR_CONSOLE_TOKEN": token})
        assert done.returncode == 2, (token, done.stdout, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("conveyor: error: $CONVEYOR_CONSOLE_TOKEN: no request can "
                               "carry this token in its X-Conveyor-Token header"), line
        assert token.strip() not in done.stderr + done.stdout  # a secret: never printed
