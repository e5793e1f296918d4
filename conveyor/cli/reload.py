"""``conveyor worker --reload``: restart the worker when the app's code changes (development).

The command becomes a small supervisor: it runs the worker as a child process
(``python -m conveyor.cli worker ...`` with the same arguments, less ``--reload``) and
watches the app's directory with watchfiles. On a change to a ``.py`` file there (or to
the ``--config`` file) it stops the child as a signal would — one SIGTERM: the daemon
drains, finishes and acknowledges what it holds, releases its queues — and starts a
fresh process, which imports the app anew. Nothing is lost or handled twice by a reload;
on a broker adapter what was published meanwhile waits in the queues.

A child that exits by itself (an edit that does not import, a failed start) is reported
and restarted at the next change. The child runs in its own session, so the terminal's
Ctrl-C reaches only this process, which forwards one SIGTERM (a drain) — a second Ctrl-C
forwards a second, which aborts the drain as it would without ``--reload``.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import click

from conveyor.platform.config import Config
from conveyor.platform.errors import ConveyorError
from conveyor.workers.serve import STOP_GRACE_S

KILL_AFTER_S = 5.0
"""How long past its own stop deadline a child gets before it is killed."""


def app_directory(app_path: str) -> Path:
    """The directory whose code makes up the app: an app file's folder, or the folder of
    the top-level package (or module) of ``MODULE:ATTR``."""
    module = app_path.rpartition(":")[0] or app_path
    if module.endswith(".py"):
        return Path(module).resolve().parent
    if "" not in sys.path:
        sys.path.insert(0, "")
    spec = importlib.util.find_spec(module.partition(".")[0])
    if spec is None:
        raise ConveyorError(f"--reload: cannot find module {module!r} to watch")
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    if spec.origin is None:
        raise ConveyorError(f"--reload: module {module!r} has no file to watch")
    return Path(spec.origin).resolve().parent


def child_command(ctx: click.Context) -> list[str]:
    """``python -m conveyor.cli [--log-level L] worker ARGS`` — this command's own
    arguments as parsed, less ``--reload``."""
    head = [sys.executable, "-m", "conveyor.cli"]
    if ctx.parent is not None and ctx.parent.params.get("log_level"):
        head += ["--log-level", str(ctx.parent.params["log_level"])]
    assert ctx.info_name is not None
    args: list[str] = [ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name == "reload" or value is None or value is False:
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif isinstance(param, click.Option):
            flag = max(param.opts, key=len)  # the long form
            args += [flag] if value is True else [flag, str(value)]
    return head + args


class _Watched:
    """Which changes restart the worker: Python files under the app's directory (as
    watchfiles' PythonFilter sees them: caches and VCS folders ignored), and the config."""

    def __init__(self, config_path: Path | None) -> None:
        from watchfiles import PythonFilter

        self._python = PythonFilter()
        self._config = str(config_path.resolve()) if config_path is not None else None

    def __call__(self, change: object, path: str) -> bool:
        return path == self._config or self._python(change, path)  # type: ignore[arg-type]


def run_with_reload(
    command: Sequence[str], app_dir: Path, config_path: Path | None, drain_timeout_s: float
) -> int:
    """Run ``command`` and restart it on every change under ``app_dir`` until SIGINT or
    SIGTERM; return the last child's exit status (0 after its drain)."""
    try:
        from watchfiles import watch
    except ImportError:
        raise ConveyorError("--reload needs watchfiles: pip install 'conveyor[reload]'") from None

    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # we say what changed
    signals = _Signals()
    previous = {sig: signal.signal(sig, signals.received)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    paths = [app_dir] + ([config_path.resolve()] if config_path is not None else [])
    where = " and ".join(str(p) for p in paths)
    click.echo(f"conveyor: reload: watching {where}; a change drains and restarts the worker",
               err=True)
    child = signals.child = _start(command)
    reported = False
    try:
        for changes in watch(*paths, watch_filter=_Watched(config_path),
                             stop_event=signals.stop, debounce=400, rust_timeout=500,
                             yield_on_timeout=True, raise_interrupt=False):
            if not changes:
                if child.poll() is not None and not reported:
                    reported = True
                    click.echo(f"conveyor: reload: the worker exited with status "
                               f"{child.returncode}; waiting for a change", err=True)
                continue
            names = ", ".join(sorted({Path(p).name for _, p in changes}))
            click.echo(f"conveyor: reload: {names} changed: draining the worker, then "
                       "starting it anew", err=True)
            _stop(child, drain_timeout_s)
            if signals.stop.is_set():
                break
            child = signals.child = _start(command)
            reported = False
        return _stop(child, drain_timeout_s)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Signals:
    """Where the reloader's stop signals land: the first ends the watch (the child is then
    drained); a later one is forwarded to the child, whose second signal aborts its drain."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None

    def received(self, sig: int, frame: FrameType | None) -> None:
        if self.stop.is_set() and self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        self.stop.set()


def _start(command: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(command), start_new_session=True)


def _stop(child: subprocess.Popen[bytes], drain_timeout_s: float) -> int:
    """Drain ``child`` with one SIGTERM; abort it (a second) past its own stop deadline,
    kill it :data:`KILL_AFTER_S` later. Returns its exit status."""
    if child.poll() is not None:
        return child.returncode
    child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=drain_timeout_s + STOP_GRACE_S + KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        click.echo("conveyor: reload: the worker did not stop: killed", err=True)
        child.kill()
        return child.wait()


def worker_with_reload(ctx: click.Context, config: Config) -> int:
    """``conveyor worker ... --reload``, its arguments parsed and checked: the exit status."""
    params = ctx.params
    if params.get("processes") is not None:
        raise click.UsageError("--reload runs one daemon: it cannot be combined with --processes")
    config_path: Path | None = params.get("config_path")
    if config_path is not None and not config_path.is_file():
        raise click.BadParameter(
            f"--reload watches the config file for changes and restarts the worker on it, "
            f"and {config_path} is no file (a pipe, as <(...) gives?): give a file",
            param_hint="'--config'")
    try:
        return run_with_reload(child_command(ctx), app_directory(params["app_path"]),
                               config_path, config.worker.drain_timeout_s)
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
