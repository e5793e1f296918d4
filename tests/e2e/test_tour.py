"""The README's tour, run as printed: its files, its commands, and the outputs it shows.

Each block of the tour follows a ``<!-- tour: NAME -->`` line in README.md. Python
blocks are files the user writes (``shop.py``, ``publish_orders.py``); ``console``
blocks are ``$ command`` lines, each followed by the output the README promises (``^C``
is Ctrl-C); ``sh`` blocks are run by bash as they stand. They run in a directory laid
out like a clone (``.venv`` and ``configs`` linked in). The Redis part runs against a
redis-server of its own: ``CONVEYOR_REDIS__URL`` points the shipped config at it and a
``redis-cli`` on the PATH adds its port, so the commands stay exactly as printed.

What varies from run to run is masked before comparing: a daemon's id, the time part
of a sequence token (its queue is compared), and the order in which messages of
different streams are handled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import conveyor
from tests.conftest import wait_until_sync
from tests.docs_blocks import console_steps
from tests.servers import RedisServer, start_redis

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_BLOCK = re.compile(r"<!-- tour: (?P<name>[\w.-]+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```",
                    re.DOTALL)


def tour_blocks() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for m in _BLOCK.finditer(README.read_text()):
        assert m["name"] not in blocks, f"tour block {m['name']!r} twice"
        blocks[m["name"]] = m["body"]
    return blocks


@dataclass
class Step:
    command: str
    output: list[str] = field(default_factory=list)


def console(block: str) -> list[Step]:
    """The block's ``$ command`` lines, a trailing ``\\`` joining the next line on as a
    shell does, each with the output lines shown under it."""
    return [Step(step.command, step.output) for step in console_steps(block)]


def masked(line: str) -> str:
    line = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "<log time> ", line)
    line = re.sub(r"\bshop-\S+-\d+-[0-9a-f]{8}\b", "<daemon>", line)
    return re.sub(r"^(\d+):\d+-\d+$", r"\1:<entry>", line)


class Shell:
    """The tour's working directory, as a user's clone looks."""

    def __init__(self, where: Path, env: dict[str, str] | None = None) -> None:
        self.where = where
        (where / "configs").symlink_to(ROOT / "configs")
        (where / ".venv").symlink_to(Path(sys.executable).parent.parent)
        self.env = {**os.environ, **(env or {})}
        self.env.pop("PYTHONPATH", None)  # the tour's imports come from the venv and cwd

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=self.where, env=self.env,
                              capture_output=True, text=True, timeout=60)

    def start(self, command: str) -> Daemon:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.where,
                                env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        return Daemon(proc)


class Daemon:
    """A worker whose merged stdout and stderr are read as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, count: int, what: str) -> None:
        wait_until_sync(lambda: len([x for x in self.lines if x.startswith("handled ")])
                        >= count or self.proc.poll() is not None, 60, what)
        assert self.proc.poll() is None, "\n".join(self.lines)

    def interrupt(self) -> list[str]:
        """Ctrl-C; the whole output once it has exited."""
        self.proc.send_signal(signal.SIGINT)
        try:
            assert self.proc.wait(30) == 0, "\n".join(self.lines)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        return self.lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def assert_matches(real: list[str], promised: list[str]) -> None:
    """Same lines once masked; handled lines in any order, the rest in order."""
    def split(lines: list[str]) -> tuple[list[str], list[str]]:
        handled = sorted(masked(x) for x in lines if x.startswith("handled "))
        return handled, [masked(x) for x in lines if not x.startswith("handled ")]

    assert split(real) == split([x for x in promised if x != "^C"]), "\n".join(real)


KAFKA_BLOCKS = {"dev-kafka", "kafka-worker", "kafka-publish"}
"""The README's Kafka tour: docs/local-brokers.md's blocks, run by test_local_brokers.py."""


def test_the_tour_has_every_block_it_is_run_from() -> None:
    assert set(tour_blocks()) == {"shop.py", "embedded", "redis-worker", "redis-publish",
                                  "publish_orders.py", "publish-script", "redis-cli",
                                  "console", *KAFKA_BLOCKS}


def test_a_tour_command_without_the_venvs_path_is_told_to_activate_the_venv() -> None:
    # `make demo` installs into .venv without activating it: a bare `conveyor` is "command
    # not found" unless the section it is in says to activate the venv first.
    text = README.read_text()
    bare = []
    for m in _BLOCK.finditer(text):
        if m["lang"] != "console":
            continue
        heading = max(text.rfind(f"\n{'#' * n} ", 0, m.start()) for n in (2, 3))
        section = text[heading:m.start()]
        bare += [(m["name"], step.command) for step in console(m["body"])
                 if step.command.startswith("conveyor ")
                 and ". .venv/bin/activate" not in section]
    assert bare == []


def test_the_readme_console_block_is_the_console_page_run_as_printed() -> None:
    """docs/console.md's start block is run as printed by tests/e2e/test_console_cli.py."""
    page = (ROOT / "docs" / "console.md").read_text()
    found = re.search(r"<!-- runnable: console [^>]*-->\n```console\n(.*?)```", page, re.S)
    assert found is not None
    assert tour_blocks()["console"] == found[1]


def test_the_readme_kafka_tour_is_the_local_brokers_page_run_as_printed() -> None:
    from tests.e2e.test_local_brokers import blocks as page_blocks

    readme, page = tour_blocks(), page_blocks()
    assert {name: readme[name] for name in KAFKA_BLOCKS} == {
        name: page[name] for name in KAFKA_BLOCKS}


def test_the_embedded_tour_shows_the_startup_hooks_order_handled(tmp_path: Path) -> None:
    blocks = tour_blocks()
    (tmp_path / "shop.py").write_text(blocks["shop.py"])
    shell = Shell(tmp_path)
    [step] = console(blocks["embedded"])
    daemon = shell.start(step.command)
    try:
        daemon.wait_for(1, "the startup hook's order handled")
        assert_matches(daemon.interrupt(), step.output)
    finally:
        daemon.kill()


def test_the_readme_tells_a_reader_without_redis_on_6379_what_this_test_does() -> None:
    """The Redis test below follows the tour on a server of its own, through
    CONVEYOR_REDIS__URL and redis-cli's -p: before its first Redis block, the README tells
    a reader whose Redis is elsewhere (or whose 6379 is taken) the same two things."""
    text = README.read_text()
    before = re.sub(r"\s+", " ", text[:text.index("<!-- tour: redis-worker -->")])
    found = re.search(r"`export CONVEYOR_REDIS__URL=(redis://[^`]+)`", before)
    assert found is not None
    assert "`redis-cli` its `-p " in before
    config = conveyor.load_config(ROOT / "configs" / "redis.toml",
                                  environ={"CONVEYOR_REDIS__URL": found[1]})
    assert config.redis.url == found[1]


@pytest.mark.redis
def test_the_redis_tour_handles_what_each_recipe_publishes_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    blocks = tour_blocks()
    (tmp_path / "shop.py").write_text(blocks["shop.py"])
    (tmp_path / "publish_orders.py").write_text(blocks["publish_orders.py"])
    shims = tmp_path / "bin"
    shims.mkdir()
    redis_cli = shims / "redis-cli"
    redis_cli.write_text(f'#!/bin/sh\nexec /usr/bin/redis-cli -p {redis_server.port} "$@"\n')
    redis_cli.chmod(0o755)
    shell = Shell(tmp_path, {"CONVEYOR_REDIS__URL": redis_server.url,
                             "PATH": f"{shims}:{os.environ['PATH']}"})
    [worker] = console(blocks["redis-worker"])
    daemon = shell.start(worker.command)
    try:
        daemon.wait_for(1, "the startup hook's order handled")
        [publish] = console(blocks["redis-publish"])
        result = shell.run(publish.command)
        assert result.returncode == 0, result.stderr
        assert [masked(x) for x in result.stdout.splitlines()] == [
            masked(x) for x in publish.output]
        [script] = console(blocks["publish-script"])
        result = shell.run(script.command)
        assert result.returncode == 0 and result.stdout == "", result.stderr
        result = shell.run(blocks["redis-cli"])
        assert result.returncode == 0, result.stderr
        daemon.wait_for(6, "orders 1, 17, 18, 19, 20 and 42 handled")
        # Exactly what was published, each once: no retry or redelivery is expected here.
        assert_matches(daemon.interrupt(), worker.output)
    finally:
        daemon.kill()


@pytest.mark.redis
def test_on_a_redis_that_keeps_nothing_the_worker_adds_only_the_warning_the_readme_names(
    tmp_path: Path,
) -> None:
    # The README's worker block is shown against a Redis that persists (compose's AOF,
    # Debian's snapshots); on one with `save ""` and `appendonly no` the README says the
    # worker's first line is a warning, and quotes it.
    quoted = "keeps no data across a restart"
    assert f"redis at redis://127.0.0.1:6379/0 {quoted}" in README.read_text().replace("\n", " ")
    server = start_redis(tmp_path / "redis", aof=False)
    try:
        blocks = tour_blocks()
        (tmp_path / "shop.py").write_text(blocks["shop.py"])
        shell = Shell(tmp_path, {"CONVEYOR_REDIS__URL": server.url})
        [worker] = console(blocks["redis-worker"])
        daemon = shell.start(worker.command)
        try:
            daemon.wait_for(1, "the startup hook's order handled")
            first, *rest = daemon.interrupt()
        finally:
            daemon.kill()
        assert quoted in first and " WARNING conveyor.redis: " in first
        # Without the other shells' orders: the startup hook's order alone.
        ready, hooks_order, *_, drained = [x for x in worker.output if x != "^C"]
        assert_matches(rest, [ready, hooks_order, re.sub(r"=6\b", "=1", drained)])
    finally:
        server.stop()
