"""`conveyor worker --reload`: what the restarted child is given, and what is watched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from conveyor.cli import main
from conveyor.cli.reload import app_directory, child_command

ROOT = Path(__file__).resolve().parents[2]


def test_the_child_gets_the_same_arguments_less_reload() -> None:
    worker = main.get_command(click.Context(main), "worker")
    assert worker is not None
    with click.Context(main, info_name="conveyor") as parent:
        parent.params = {"log_level": "debug"}
        ctx = worker.make_context("worker", ["tests.apps.recorder:app", "--slots", "3",
                                             "--drain-timeout", "2.5", "--reload"],
                                  parent=parent)
        command = child_command(ctx)
    assert command == [sys.executable, "-m", "conveyor.cli", "--log-level", "debug", "worker",
                       "tests.apps.recorder:app", "--slots", "3", "--drain-timeout", "2.5"]


def test_the_watched_directory_is_the_app_files_folder_or_its_top_package(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.py").write_text("")
    assert app_directory(f"{tmp_path / 'app.py'}:app") == tmp_path
    assert app_directory("tests.apps.recorder:app") == ROOT / "tests"


def test_reload_with_processes_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.recorder:app",
         "--reload", "--processes", "1:2"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--reload runs one daemon" in done.stderr and "Traceback" not in done.stderr


def test_reload_with_a_config_given_as_a_pipe_is_a_usage_error() -> None:
    # watchfiles cannot watch a pipe (`--config <(...)`): "No path was found", a
    # traceback; and the restarted worker could not read the pipe again anyway.
    done = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m conveyor.cli worker tests.apps.recorder:app "
                       "--reload --config <(cat configs/local.toml)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("conveyor: error: Invalid value for '--config': --reload "), line
