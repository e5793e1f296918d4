"""`conveyor worker --reload` on Redis, as a developer runs it: edit a handler file while
messages flow; the worker drains, a fresh process imports the new code, and every
message is handled exactly once — the old code before the edit, the new code after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor import Client, Publish, load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import REPO, wait_file_lines, write_config
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

APP = '''
import msgspec
from conveyor import App

VERSION = "{version}"
app = App("reload-test")
_out = open({out!r}, "a", buffering=1)


class Item(msgspec.Struct):
    seq: int


@app.handler("items")
async def on_item(item: Item) -> None:
    _out.write(f"{{VERSION}} {{item.seq}}\\n")
'''


def publish(config: Path, seqs: range) -> None:
    async def run() -> None:
        async with Client.from_config(load_config(config)) as client:
            await client.publish_batch([Publish("items", f"k{s % 7}", {"seq": s}) for s in seqs])

    asyncio.run(run())


@contextlib.contextmanager
def worker_reloading(handlers: Path, config: Path, err_path: Path
                     ) -> Iterator[tuple[Callable[[], str], Callable[[], str]]]:
    """``conveyor worker HANDLERS:app --reload`` on ``config``: what it has written to
    stderr (``err_path``) so far, and ``stop()``, which sends SIGTERM, asserts a clean
    exit without a traceback and returns the whole stderr. The worker never outlives
    the block."""
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", f"{handlers}:app",
             "--config", str(config), "--reload"],
            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL, stderr=err,
        )
    stderr = err_path.read_text

    def stop() -> str:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, stderr()
        log = stderr()
        assert "Traceback" not in log, log
        return log

    try:
        yield stderr, stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_edited_handler_file_restarts_the_worker_on_the_new_code_losing_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    handlers = app_dir / "handlers.py"
    out = tmp_path / "handled.txt"
    handlers.write_text(APP.format(version="v1", out=str(out)))
    config = write_config(tmp_path / "c.toml", redis_server.url, worker={"drain_timeout_s": 5.0})
    with worker_reloading(handlers, config, tmp_path / "worker.err") as (stderr, stop):
        wait_until_sync(lambda: "ready" in stderr(), 30, "the first worker to be ready")
        publish(config, range(0, 100))
        wait_file_lines([out], 100, 30, "the old code to handle the first 100")

        handlers.write_text(APP.format(version="v2", out=str(out)))
        publish(config, range(100, 200))  # while the worker drains and restarts
        wait_until_sync(lambda: stderr().count(" ready") >= 2, 30,
                        "a fresh worker after the edit")
        publish(config, range(200, 300))
        wait_file_lines([out], 300, 30, "all 300 to be handled")

        log = stop()
    assert "handlers.py changed: draining the worker" in log
    assert log.count("conveyor: drained") == 2, log  # the reload's drain and the last one
    rows = [line.split() for line in out.read_text().splitlines()]
    seqs = [int(seq) for _, seq in rows]
    # A graceful drain acknowledges what it handled and hands back the rest: no duplicates.
    assert sorted(seqs) == list(range(300)), "lost or duplicated"
    version = {int(seq): v for v, seq in rows}
    assert {version[s] for s in range(100)} == {"v1"}
    assert {version[s] for s in range(200, 300)} == {"v2"}, "published after the restart"


def test_an_edit_that_breaks_the_app_is_named_and_the_fix_handles_what_waited(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """docs/reload.md: an edit that breaks the app is reported with its file and line,
    and the next save starts the worker again. Messages published while the app is
    broken wait in the queues: each of the 300 is handled once (none lost, no duplicate:
    every drain here is graceful)."""
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    handlers = app_dir / "handlers.py"
    out = tmp_path / "handled.txt"
    good = APP.format(version="v1", out=str(out))
    handlers.write_text(good)
    config = write_config(tmp_path / "c.toml", redis_server.url, worker={"drain_timeout_s": 5.0})
    with worker_reloading(handlers, config, tmp_path / "worker.err") as (stderr, stop):
        wait_until_sync(lambda: "ready" in stderr(), 30, "the first worker to be ready")
        publish(config, range(0, 100))
        wait_file_lines([out], 100, 30, "the first 100")

        # A dependency not installed, then a misspelled handler option: both break it.
        handlers.write_text(good.replace("import msgspec\n",
                                         "import msgspec\nimport not_installed_dep\n"))
        wait_until_sync(lambda: "the worker exited with status 2" in stderr(), 30,
                        "the broken edit to be reported")
        publish(config, range(100, 200))  # no worker runs: they wait in the queues
        handlers.write_text(good.replace('@app.handler("items")',
                                         '@app.handler("items", retry_atempts=2)'))
        wait_until_sync(lambda: stderr().count("the worker exited with status 2") >= 2, 30,
                        "the second broken edit to be reported")
        handlers.write_text(good.replace('"v1"', '"v2"'))
        wait_until_sync(lambda: stderr().count(" ready") >= 2, 30, "the fixed worker")
        publish(config, range(200, 300))
        wait_file_lines([out], 300, 30, "all 300 to be handled")

        log = stop()
    errors = [line for line in log.splitlines() if line.startswith("conveyor: error: ")]
    assert len(errors) == 2, log
    assert (f"importing '{handlers}:app' failed at {handlers}:3: ModuleNotFoundError: "
            "No module named 'not_installed_dep'") in errors[0], errors[0]
    assert (f"importing '{handlers}:app' failed at {handlers}:") in errors[1], errors[1]
    assert "HandlerDeclarationError: handler for 'items': unknown option(s) " \
           "['retry_atempts']" in errors[1], errors[1]
    seqs = sorted(int(seq) for _, seq in (line.split() for line in
                                          out.read_text().splitlines()))
    assert seqs == list(range(300)), "lost or duplicated"
