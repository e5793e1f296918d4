"""``conveyor worker``: run an app's worker daemon — one process, ``--processes MIN:MAX``
under the supervisor, or ``--reload`` for development — until a signal, then drain.

The daemon is :class:`conveyor.workers.daemon.WorkerDaemon`; this module parses, loads
the config and the app, and prints the two lines a user (and the tests) wait for:
``conveyor: worker ID ready`` and ``conveyor: drained ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import click

from conveyor.cli.common import (
    DAY_S,
    MAX_INT64,
    Bounded,
    Interrupted,
    as_cli_error,
    config_option,
    config_source,
    fail,
    read_config_or_exit,
)
from conveyor.platform.config import blame
from conveyor.platform.errors import ConfigError, ConveyorError
from conveyor.platform.terminal import kept


@click.command()
@click.argument("app_path")
@config_option
@click.option("--slots", type=click.IntRange(min=1, max=MAX_INT64),
              help="Override [slots] count.")
@click.option(
    "--drain-timeout", "drain_timeout_s", type=Bounded(0, DAY_S),
    help="Override [worker] drain_timeout_s.",
)
@click.option(
    "--processes", metavar="MIN:MAX", default=None,
    help="Run MIN..MAX daemon processes, scaled on consumer lag (see [supervisor]).",
)
@click.option(
    "--http-port", type=click.IntRange(1, 65_535), default=None,
    help="Serve /metrics, /healthz and /readyz on this port (overrides [http] port).",
)
@click.option("--reload", is_flag=True,
              help="Development: drain and restart the worker when a .py file under the "
                   "app's directory (or the config) changes. Needs watchfiles.")
def worker(
    app_path: str, config_path: Path | None, slots: int | None, drain_timeout_s: float | None,
    processes: str | None, http_port: int | None, reload: bool,
) -> None:
    """Run an app's worker daemon until SIGINT/SIGTERM, then drain.

    APP_PATH is MODULE:ATTR or FILE.py:ATTR (ATTR: `app` if left out). It prints
    `conveyor: worker ID ready` once started. On a signal it drains: stops pulling,
    finishes in-flight messages within the drain timeout, acknowledges them, releases
    its queues, prints `conveyor: drained ...` (what it pulled, acknowledged,
    handled...) and exits 0. With --processes the same two lines cover all its
    processes.

    Exit status: 0 after a drain; 2 for a bad argument or config, or an APP_PATH that
    cannot be imported (a missing module, or an app file that fails at import: a syntax
    error or an exception, reported with its file and line); 1 when the daemon fails.

    \b
    Examples:
      conveyor worker shop:app
      conveyor worker shop:app --config configs/redis.toml --slots 16
      conveyor worker shop:app --config configs/redis.toml --processes 1:4
      conveyor worker shop:app --config configs/redis.toml --http-port 9464
      conveyor worker shop:app --reload
    """
    from conveyor.loader import load_app
    from conveyor.workers.daemon import DrainReport, WorkerDaemon
    from conveyor.workers.http_endpoint import daemon_endpoint
    from conveyor.workers.serve import (
        leave_running_threads,
        run_served,
        serve,
        stopped_status,
    )

    err = kept(sys.stderr)  # its lines, whatever a handler does to sys.stderr
    overrides: dict[str, dict[str, Any]] = {}
    if slots is not None:
        overrides["slots"] = {"count": slots}
    if drain_timeout_s is not None:
        overrides["worker"] = {"drain_timeout_s": drain_timeout_s}
    if http_port is not None:
        overrides["http"] = {"port": http_port}
    applied: dict[str, str] = {}  # who set which field, to name them in a later error
    config, config_text = read_config_or_exit(config_path, overrides, applied)
    given = (http_port is not None, config_source(config_path), applied)
    try:
        app = load_app(app_path)
    except ConveyorError as exc:
        raise click.BadParameter(str(exc), param_hint="APP_PATH") from None
    if reload:
        from conveyor.cli.reload import worker_with_reload

        sys.exit(worker_with_reload(click.get_current_context(), config))
    if processes is not None:
        from conveyor.workers.supervisor import parse_processes, run_supervisor

        try:  # only the argument's own errors are usage errors, not the run's
            low, _ = parse_processes(processes)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--processes") from None
        if low > config.queues.total:  # MAX is capped there by the scaler; MIN cannot be
            raise click.BadParameter(
                f"MIN {low} is more than the {config.queues.total} queues "
                "([queues] total): a process beyond them would own none",
                param_hint="--processes")
        try:
            report = run_supervisor(app_path, app.name, config, processes, config_path,
                                    overrides, ready=lambda what: _say_ready(what, err),
                                    log_level=_log_level(click.get_current_context()),
                                    config_text=config_text)
        except ConveyorError as exc:
            fail(_as_given(exc, *given))
        click.echo(f"conveyor: drained {report}", err)
        return

    async def run() -> DrainReport:
        daemon = WorkerDaemon(app, config)
        endpoint = None
        if config.http.port is not None:
            endpoint = daemon_endpoint(daemon, config.http.host, config.http.port)
        said = f"conveyor: worker {daemon.member.id}"
        return await serve(daemon, endpoint=endpoint, ready=lambda: daemon.when_ready(
            lambda: _say_ready(daemon.member.id, err),
            lambda what: click.echo(f"{said} started; waiting for the {what}", err)))

    try:
        report = run_served(run)
    except ConveyorError as exc:
        error = as_cli_error(_as_given(exc, *given))
        assert error is not None
        error.show(err)
        leave_running_threads(error.exit_code)
        sys.exit(error.exit_code)
    except (SystemExit, KeyboardInterrupt) as exc:  # a handler's or hook's (stop signals
        status = stopped_status(exc)                # are the loop's): not a drain
        if isinstance(exc, KeyboardInterrupt):
            Interrupted().show(err)  # as Ctrl-C ends a command, before threads are left
        leave_running_threads(status)  # one the app started must not hold the exit
        sys.exit(status)
    click.echo(f"conveyor: drained {report}", err)
    leave_running_threads(0)


def _as_given(exc: ConveyorError, option: bool, source: str,
              applied: dict[str, str]) -> ConveyorError:
    """A port the endpoint cannot listen on, blamed on where it was given: the error names
    ``$.http.port``, which for ``--http-port`` named a field the user never wrote."""
    from conveyor.workers.http_endpoint import ListenError

    if not isinstance(exc, ListenError):
        return exc
    if option:
        error = as_cli_error(click.BadParameter(
            f"cannot listen on {exc.address} ({exc.reason}); choose another port",
            param_hint="--http-port"))
        assert error is not None
        return error
    return ConfigError(f"{blame(str(exc), source, applied)}: {exc}")


def _log_level(ctx: click.Context) -> str | None:
    """The main command's ``--log-level``, for the processes this one starts."""
    level = ctx.parent.params.get("log_level") if ctx.parent is not None else None
    return str(level) if level is not None else None


def _say_ready(what: str, err: TextIO) -> None:
    click.echo(f"conveyor: worker {what} ready", err)
