"""The ``conveyor`` command: thin — parse, load config, call the library.

One module per command group, so a command is found by its name (in ``--help`` order):

    worker.py    conveyor worker            (reload.py: its --reload, for development)
    demo.py      conveyor demo
    publish.py   conveyor publish
    configs.py   conveyor configs
    dev.py       conveyor dev kafka|redis
    status.py    conveyor status
    dlq.py       conveyor dlq list|show|replay|purge
    groups.py    conveyor groups list|delete
    asyncapi.py  conveyor asyncapi
    console.py   conveyor console         (the web app: conveyor/console/)
    rewind.py    conveyor rewind
    deploy.py    conveyor deploy kubernetes
    bench.py     conveyor bench throughput|telemetry|scale-down
    sim.py       conveyor sim [filter|placement|balancer]
    tune.py      conveyor tune

and what they share: ``common.py`` (the options, the error style and exit status) and
``render.py`` (the tables of status, groups and dlq). A command module imports no other.

This module is the main command and the list of the others: each joins with one
``main.add_lazy_command(name, "module:command", section=...)`` line at the end (sections:
:data:`conveyor.cli.common.SECTIONS`); a command's module is imported only when that
command runs, so ``conveyor dlq list`` loads no worker and ``conveyor worker`` no console.
Errors, from click, the config or the library, all print as ``conveyor: error: ...``
(:class:`conveyor.cli.common.TaskGroup`).
"""

from __future__ import annotations

import logging
import sys

import click

from conveyor.cli.common import TaskGroup
from conveyor.platform.outage import OUTAGE_REPEAT
from conveyor.platform.terminal import VisibleFormatter, kept

__all__ = ["main"]


SERVING = frozenset({"worker", "console"})
"""Commands that serve until stopped: they log as a service does, outages included."""


def _setup_logging(level: str | None, command: str | None) -> None:
    """Logging on stderr. A one-shot command (any but :data:`SERVING`), at the default
    level, drops aiokafka's own lines (its failure reaches the user as the command's
    one-line error, which names the address) and the repeats of an outage note ("still
    waiting for ..."): a broker that is down costs the first note and the final error."""
    serving = command in SERVING
    handler = logging.StreamHandler(kept(sys.stderr))  # a handler's sys.stderr.close()
    # Keys, headers and errors come from producers: no escape sequence reaches the
    # terminal, no newline forges a line (conveyor.platform.terminal).
    handler.setFormatter(VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(
        level=getattr(logging, (level or ("info" if command == "worker" else "warning")).upper()),
        handlers=[handler],
    )
    if level is None and not serving:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        for root_handler in logging.getLogger().handlers:
            root_handler.addFilter(_no_outage_repeats)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: read when asked (the installed metadata costs some 40 ms to load)."""
    if value and not ctx.resilient_parsing:
        from conveyor.version import version
        click.echo(f"conveyor {version()}")
        ctx.exit()


def _no_outage_repeats(record: logging.LogRecord) -> bool:
    return not getattr(record, OUTAGE_REPEAT, False)


@click.group(cls=TaskGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", "-V", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show the version and exit.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=None,
    help="Default: info for `worker`, warning for everything else.",
)
@click.pass_context
def main(ctx: click.Context, log_level: str | None) -> None:
    """Conveyor: a worker platform for messages in Kafka, Redis, or in-process.

    Every error is one line, `conveyor: error: ...`; the exit status is 2 for a bad
    argument or config, 1 when the run failed, 130 after Ctrl-C (`conveyor:
    interrupted`; commands that run until Ctrl-C stop and exit 0). `conveyor COMMAND
    --help` shows a command's options and examples.

    \b
    Examples:
      conveyor demo
      conveyor worker shop:app --config configs/redis.toml
      conveyor status --config configs/redis.toml
    """
    _setup_logging(log_level, ctx.invoked_subcommand)


# Every command (module:command), by section (common.SECTIONS): `--help` lists them in
# this order. A command's module is imported when the command runs (or shows help).
main.add_lazy_command("worker", "conveyor.cli.worker:worker", section="run")
main.add_lazy_command("demo", "conveyor.cli.demo:demo", section="run")
main.add_lazy_command("publish", "conveyor.cli.publish:publish", section="run")
main.add_lazy_command("configs", "conveyor.cli.configs:configs", section="run")
main.add_lazy_command("dev", "conveyor.cli.dev:dev", section="run")
main.add_lazy_command("status", "conveyor.cli.status:status", section="inspect")
main.add_lazy_command("dlq", "conveyor.cli.dlq:dlq", section="inspect")
main.add_lazy_command("groups", "conveyor.cli.groups:groups", section="inspect")
main.add_lazy_command("asyncapi", "conveyor.cli.asyncapi:asyncapi", section="inspect")
main.add_lazy_command("console", "conveyor.cli.console:console", section="inspect")
main.add_lazy_command("rewind", "conveyor.cli.rewind:rewind", section="operate")
main.add_lazy_command("deploy", "conveyor.cli.deploy:deploy", section="operate")
main.add_lazy_command("bench", "conveyor.cli.bench:bench", section="lab")
main.add_lazy_command("sim", "conveyor.cli.sim:sim", section="lab")
main.add_lazy_command("tune", "conveyor.cli.tune:tune", section="lab")
