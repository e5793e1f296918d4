"""What every command module shares: the options that load a config, and the one way
every command reports an error (and so its exit status).

Every error is one line on stderr, ``conveyor: error: MESSAGE``, whoever found it (click
while parsing, the config, the command, the library): exit 2 for a user's mistake (a bad
argument, a bad config, naming something that is not there), 1 when the run itself
failed. Which errors are the user's is decided here (:func:`as_cli_error`), not by the
library's error tree. A warning is one line too, ``conveyor: warning: MESSAGE``.

Ctrl-C (SIGINT) ends a command in one line too, ``conveyor: interrupted``, with exit
status 130 (128 + SIGINT, the shell's convention), whatever it was doing. The commands
that run until Ctrl-C (``worker``, ``console``, ``dev``, ``status --watch``) are not
interrupted by it: it is how they end, and they exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import math
import signal
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import IO, Any, NoReturn, TypeGuard, TypeVar, cast

import click
from click.exceptions import NoArgsIsHelpError

from conveyor.platform.config import Config, parse_config, read_config_file
from conveyor.platform.errors import (
    ConfigError,
    ConveyorError,
    ForwardRewindError,
    HandlerDeclarationError,
    InvalidArgumentError,
    TokenRangeError,
    UnknownGroupError,
)
from conveyor.platform.terminal import visible

T = TypeVar("T")

USAGE_ERROR = 2
"""Exit status of a user's mistake: a bad argument or config (click's own, too)."""

INTERRUPTED = 130
"""Exit status of a command ended by Ctrl-C (SIGINT): 128 + the signal's number."""

USER_MISTAKES: tuple[type[ConveyorError], ...] = (ForwardRewindError, TokenRangeError,
                                                  UnknownGroupError, HandlerDeclarationError)
"""Library errors that, met by a command, are the user's mistake (exit 2) besides a bad
config: a rewind target ahead of the app or out of its backend's range (``--to``), an
app with no consumer group (``--app``), an app whose handlers cannot be built (found as
the worker subscribes, e.g. an interceptor's ``wrap`` that returned no step). The error
tree says what an error is; which ones exit 2 is the CLI's call. A command that knows
the option to name catches them itself (``--app: ...``)."""


class CliError(click.ClickException, ConveyorError):
    """An error as every command prints it: ``conveyor: error: MESSAGE``, one line; the
    run failed (exit 1). The message's control characters are shown escaped
    (:func:`~conveyor.platform.terminal.visible`): it may quote a producer's stream key
    or an argument, whose newline would be a second line and whose ESC would reach the
    terminal."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"conveyor: error: {visible(self.format_message())}", file=file, err=True)


class CliUsageError(CliError):
    """The user's mistake: a bad argument or config (exit 2)."""

    exit_code = USAGE_ERROR


class Interrupted(CliError):
    """Ctrl-C ended the command: ``conveyor: interrupted``, exit 130, no traceback (and
    not click's ``Aborted!``, exit 1)."""

    exit_code = INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted")

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo("conveyor: interrupted", file=file, err=True)


def warn(message: str) -> None:
    """``conveyor: warning: MESSAGE`` on stderr, one line as an error is: something to
    know, not a failure."""
    click.echo(f"conveyor: warning: {visible(message)}", err=True)


def as_cli_error(exc: BaseException) -> CliError | None:
    """``exc`` in the CLI's one style, or None to let it through (help, an unknown
    exception: a bug, whose traceback is worth having)."""
    if isinstance(exc, (CliError, NoArgsIsHelpError)):
        return exc if isinstance(exc, CliError) else None
    if isinstance(exc, click.UsageError):
        message = " ".join(exc.format_message().split()).rstrip(".")
        if exc.ctx is not None:
            message += _main_option_hint(exc) or f" (see '{exc.ctx.command_path} --help')"
        return CliUsageError(message)
    if isinstance(exc, click.ClickException):
        return (CliUsageError if exc.exit_code == USAGE_ERROR else CliError)(
            exc.format_message())
    if _unwritable_output(exc):
        return CliError(f"cannot write the output: {exc.strerror}")
    if isinstance(exc, ConfigError):
        return CliUsageError(f"config: {exc}")
    if isinstance(exc, USER_MISTAKES):
        return CliUsageError(str(exc))
    if isinstance(exc, ConveyorError):
        return CliError(str(exc))
    return None


UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""Why standard output can take no more: a full disk or quota, a file past its size
limit, a device failing (``conveyor dlq list --json > letters.json``). A reader gone
(``EPIPE``: ``| head``) is click's to end, quietly."""


def _unwritable_output(exc: BaseException) -> TypeGuard[OSError]:
    """Whether ``exc`` is standard output refusing a write: an ``OSError`` of
    :data:`UNWRITABLE` naming no file (a command names the files it writes itself). Its
    traceback was the first write of any command."""
    return isinstance(exc, OSError) and exc.errno in UNWRITABLE and exc.filename is None


def _main_option_hint(exc: click.UsageError) -> str:
    """For an option of the main command given after a subcommand (``conveyor worker
    --log-level warning …``, a common slip): where it goes instead; else ``""``."""
    ctx = exc.ctx
    if not isinstance(exc, click.NoSuchOption) or ctx is None or ctx.parent is None:
        return ""
    root = ctx.find_root()
    if not any(exc.option_name in p.opts for p in root.command.params):
        return ""
    under = ctx.command_path.removeprefix(root.command_path).strip()
    return (f": {exc.option_name} is {root.command_path}'s own option, so it goes before"
            f" the command ('{root.command_path} {exc.option_name} … {under} …')")


SECTIONS = {
    "run": "Run",
    "inspect": "Inspect",
    "operate": "Operate",
    "lab": "Lab (simulations and benchmarks)",
}
"""The main command's sections, in the order ``--help`` lists them."""


class TaskGroup(click.Group):
    """The main command: subcommands listed by task (``SECTIONS``), in the order they were
    added; every error in the CLI's one style (:func:`as_cli_error`).

    A command joins with one line: ``main.add_lazy_command("name", "module:command",
    section="run")`` (or ``main.add_command(command, section="run")``, imported already).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections: dict[str, list[str]] = {}
        self._lazy: dict[str, str] = {}

    def add_command(self, cmd: click.Command, name: str | None = None, *,
                    section: str = "operate") -> None:
        self._add_to(section, name or cmd.name or "")
        super().add_command(cmd, name)

    def add_lazy_command(self, name: str, where: str, *, section: str = "operate") -> None:
        """A command ``where`` (``"module:attribute"``) holds, imported when it is run or
        its help is shown: a command loads its own module, not every other command's."""
        self._add_to(section, name)
        self._lazy[name] = where

    def _add_to(self, section: str, name: str) -> None:
        if section not in SECTIONS:
            raise InvalidArgumentError(
                f"section {section!r}: not one of {', '.join(SECTIONS)}")
        self.sections.setdefault(section, []).append(name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for section in SECTIONS for name in self.sections.get(section, [])]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        where = self._lazy.get(cmd_name) if found is None else None
        if where is not None:
            module, _, attribute = where.partition(":")
            with _sigint_held():
                loaded = importlib.import_module(module)
            found = cast(click.Command, getattr(loaded, attribute))
            self.commands[cmd_name] = found
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = max((len(name) for name in self.list_commands(ctx)), default=0)
        limit = formatter.width - 6 - width
        for section, title in SECTIONS.items():
            rows = []
            for name in self.sections.get(section, []):
                cmd = self.get_command(ctx, name)
                if cmd is not None and not cmd.hidden:  # names padded: one column for all
                    rows.append((name.ljust(width), cmd.get_short_help_str(limit)))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows, col_max=width)

    # KeyboardInterrupt is caught here, inside click's standalone mode, which would
    # otherwise turn it into Abort ("Aborted!", exit 1).
    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt:
            raise Interrupted() from None
        except Exception as exc:
            _reraise(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted() from None
        except Exception as exc:
            _reraise(exc)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT held while a command's modules load, as the ``conveyor`` script holds it
    while this package loads (``_conveyor_cli``): a Ctrl-C meanwhile is raised as they
    are released, where the command's handling ends it in one line, and cuts no import
    (nor an extension module's initialisation) short."""
    held = {signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _reraise(exc: Exception) -> NoReturn:
    error = as_cli_error(exc)
    if error is None or error is exc:
        raise exc
    raise error from None


def load_config_or_exit(path: Path | None,
                        overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load config; a bad one is a usage error naming the field (exit 2)."""
    return read_config_or_exit(path, overrides)[0]


def read_config_or_exit(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None,
                        applied: dict[str, str] | None = None,
                        ) -> tuple[Config, bytes | None]:
    """:func:`load_config_or_exit`, and the file's bytes as read (None: no file), for
    processes this one starts: a file given as ``<(command)`` is a pipe, which they could
    neither open (its descriptor is this process's) nor read again. ``applied``: as
    :func:`parse_config`'s."""
    try:
        text = None if path is None else read_config_file(path)
        return parse_config(text, config_source(path), overrides=overrides,
                            applied=applied), text
    except ConfigError as exc:
        fail(exc)


def config_source(path: Path | None) -> str:
    """How config errors name where the config came from."""
    return "defaults" if path is None else str(path)


def fail(exc: ConveyorError) -> NoReturn:
    """Exit for an error raised after start-up: 2 for a config error or another of
    :data:`USER_MISTAKES`, else 1."""
    error = as_cli_error(exc)
    assert error is not None
    raise error


def usage(message: str) -> NoReturn:
    """A usage error found after start-up (the message names the argument): exit 2."""
    raise CliUsageError(message)


def run_or_exit(work: Coroutine[Any, Any, T]) -> T:
    """:func:`run_command` of ``work``; a Conveyor error exits as :func:`fail` says."""
    try:
        return run_command(work)
    except ConveyorError as exc:
        fail(exc)


def run_command(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, where Ctrl-C cancels ``work`` from the event loop (and the
    command ends with ``KeyboardInterrupt``, as under ``asyncio.run``); a second Ctrl-C
    ends it at once, even while a synchronous step holds the loop.

    ``asyncio.run`` cancels it from the Python signal handler itself, which runs between
    any two bytecodes: inside the loop's own callback that was completing a socket
    connect, it left CPython 3.11 setting a result on the future it had just cancelled,
    logged as ``ERROR asyncio: Exception in callback … InvalidStateError`` above the
    command's one line. The handler here hands the cancel to the loop, to run as a
    callback of its own. (``loop.add_signal_handler`` did so too, but ran the handler
    itself on the loop: a command whose code held the loop heard no Ctrl-C at all.)"""
    return asyncio.run(_interruptible(work))


async def _interruptible(work: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal interrupted
        if interrupted:  # a second Ctrl-C: end now, as asyncio.run does
            raise KeyboardInterrupt
        interrupted = True
        loop.call_soon_threadsafe(task.cancel)  # wakes a loop waiting in select()

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        return await work
    try:
        return await work
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def interrupted_at_once() -> Iterator[None]:
    """Within the block, Ctrl-C raises ``KeyboardInterrupt`` where it lands, as Python's
    default handler does (``asyncio.run`` keeps a handler that is not the default), so
    one Ctrl-C ends the command (``conveyor: interrupted``, exit 130). For work that
    holds the event loop for long stretches by design, a benchmark's timed loops: under
    ``asyncio.run`` or :func:`run_command` the first Ctrl-C only cancels it at its next
    await, minutes later. ``finally`` blocks and context managers still clean up."""

    def at_once(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, at_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def refuse_embedded(config: Config, command: str, why: str) -> None:
    """A usage error for commands that need state outside this process (exit 2)."""
    from conveyor.backends import backend

    if backend(config.queues.adapter).in_process:
        usage(f"{command}: the {config.queues.adapter} adapter lives inside the worker's "
              f"process, so {why}; "
              "use --config with a redis or kafka config (e.g. configs/redis.toml)")


DAY_S = 86_400.0
"""The longest duration a command's option takes (as the config's: ``Seconds``)."""


MAX_INT64 = 2**63 - 1
"""The most any whole-number config field holds (msgspec's 64 bits): an option that sets
one (``--slots``) is bounded by it, or a larger value was refused by the config as its
field, ``slots.count``, not as the option."""


SEED = click.IntRange(min=0)
"""A random seed: numpy's generators take any whole number from 0 (``-1`` was a
traceback)."""


class Bounded(click.FloatRange):
    """Every float option's type: bounded on both sides, ``nan`` refused. Click's own
    ``FloatRange`` lets ``nan`` past any bound (it compares false with every number)
    and takes ``inf`` or ``1e300`` without a ``max``: ``status --watch nan`` reached
    ``time.sleep`` as a traceback, ``demo --work-ms inf`` never ended."""

    def __init__(self, min: float, max: float) -> None:
        super().__init__(min=min, max=max)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


class FilePath(click.Path):
    """Every path option's type: click's ``Path``, and an empty path refused. Click
    reads ``''`` as the current directory: ``--plot ''`` wrote ``./.png``, ``configs
    --copy ''`` wrote into the current directory (a ``"$DIR"`` left unset, say)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str | bytes) and not value:
            self.fail("an empty path names nothing", param, ctx)
        return super().convert(value, param, ctx)


config_option = click.option(
    "--config",
    "config_path",
    type=FilePath(exists=True, dir_okay=False, path_type=Path),
    help="TOML config file (see configs/). Defaults: the embedded memory adapter.",
)
"""--config of commands that run the app here (worker, demo): the embedded default."""

broker_config_option = click.option(
    "--config",
    "config_path",
    type=FilePath(exists=True, dir_okay=False, path_type=Path),
    help="TOML config of a redis or kafka app (configs/redis.toml, configs/kafka.toml). "
         "Needed: the embedded memory adapter, the default, lives inside the worker's "
         "process and is refused here.",
)
"""--config of commands that write to a broker from outside the app (publish, rewind)."""

inspect_config_option = click.option(
    "--config", "config_path", type=FilePath(exists=True, dir_okay=False, path_type=Path),
    help="TOML config of a redis or kafka app (e.g. configs/redis.toml).",
)
"""--config of commands that read a broker's state (status, groups)."""


def app_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--app`` of the commands that name a consumer group: checked as ``App(name)``
    checks it, so a bad one is a usage error naming the option (exit 2), not a config
    error found while reading the broker."""
    from conveyor.platform.ids import NAME

    if value is not None and not NAME.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not an app name: use 1-128 ASCII letters, digits, '-', '_' or "
            "'.' (it names the consumer group)")
    return value


def host_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--host`` of the commands that listen (console, dev): a name no resolver takes (a
    part longer than 63 characters, ``a..b``) is a usage error naming the option; the
    resolver's own error for it was a ``UnicodeError`` traceback."""
    from conveyor.platform.config.hosts import host_problem

    problem = None if value is None else host_problem(value)
    if problem is not None:
        raise click.BadParameter(problem)
    return value
