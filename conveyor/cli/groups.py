"""``conveyor groups``: the consumer groups on the queues — list every app's, delete one
nobody runs.

The reading and the deleting are in :mod:`conveyor.platform.operations.groups` and the adapters'
group methods; the table in :mod:`conveyor.cli.render`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import (
    app_name,
    fail,
    inspect_config_option,
    load_config_or_exit,
    refuse_embedded,
    run_command,
    run_or_exit,
    usage,
    warn,
)
from conveyor.cli.render import groups_view, print_table
from conveyor.platform.errors import ConfigError, ConveyorError


@click.group("groups")
def groups() -> None:
    """Consumer groups on the queues: list, delete one nobody runs.

    \b
    Examples:
      conveyor groups list --config configs/redis.toml
      conveyor groups delete --app old-app --config configs/redis.toml
    """


@groups.command("list", short_help="Every app's group: queues, lag, members, retention.")
@inspect_config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def groups_list(config_path: Path | None, as_json: bool) -> None:
    """Every app's group: queues, lag, last read, members, who holds retention.

    The embedded (memory) adapter is refused (exit 2): its groups live in the worker's
    process.

    \b
    Examples:
      conveyor groups list --config configs/redis.toml
      conveyor groups list --config configs/kafka.toml --json
    """
    from conveyor.backends import command_adapter
    from conveyor.platform.operations.groups import summarise

    config = load_config_or_exit(config_path)
    refuse_embedded(config, "groups list", "its consumer groups exist only there and this "
                    "command would list none")

    async def run() -> tuple[list[Any], bool]:
        adapter = command_adapter(config)
        try:
            queues = range(config.queues.total)
            infos = await adapter.groups.on(queues)  # a queue's key of another type: none
            for problem in await adapter.store_problems(queues, []):
                warn(problem.warning)
            return summarise(infos), adapter.groups.retention_follows_groups
        finally:
            await adapter.close()

    found, follows = run_or_exit(run())
    if as_json:
        click.echo(json.dumps({"groups": [asdict(g) for g in found],
                               "retention_follows_groups": follows}))
        return
    print_table(groups_view(found, follows, time.time()))


@groups.command("delete", short_help="Remove an app's consumer group from every queue.")
@inspect_config_option
@click.option("--app", "group", required=True, callback=app_name,
              help="The app's name (its consumer group).")
@click.option("--force", is_flag=True,
              help="Delete even though the app looks alive (its daemons would recreate the "
                   "group at the start of each queue and handle every kept message again).")
@click.option("--with-dead-letters", is_flag=True,
              help="Also delete the app's dead letters (kept by default).")
def groups_delete(config_path: Path | None, group: str, force: bool,
                  with_dead_letters: bool) -> None:
    """Remove an app's consumer group from every queue (it holds retention no more).

    Refused while the app looks alive (daemons registered, leases held, Kafka group
    members, a queue read in the last 10 s) unless --force: exit 1. An app with no group
    on any queue is a usage error (exit 2). On Redis its leases, fencing counters and
    membership go too; its dead letters only with --with-dead-letters. The embedded
    (memory) adapter is refused (exit 2): its groups live in the worker's process.

    \b
    Examples:
      conveyor groups delete --app old-app --config configs/redis.toml
      conveyor groups delete --app old-app --with-dead-letters \\
          --config configs/redis.toml
    """
    from conveyor.backends import command_adapter, coordination
    from conveyor.platform.errors import AppAliveError, UnknownGroupError
    from conveyor.platform.operations.groups import delete_app_group, queue_ranges

    config = load_config_or_exit(config_path)
    refuse_embedded(config, "groups delete", "its consumer groups exist only there and "
                    "vanish with it")

    async def run() -> list[int]:
        adapter = command_adapter(config)
        membership, leases = coordination(config, group)
        try:
            return await delete_app_group(
                adapter, membership, leases, group, range(config.queues.total),
                force=force, dead_letters=with_dead_letters,
            )
        finally:
            await adapter.close()
            await membership.close()
            await leases.close()

    try:
        removed = run_command(run())
    except UnknownGroupError as exc:
        usage(f"--app: {exc}")
    except ConfigError as exc:
        usage(str(exc))
    except AppAliveError as exc:
        fail(AppAliveError(f"{exc}, or pass --force to delete its group anyway"))
    except ConveyorError as exc:
        fail(exc)
    kept = ("its dead letters too" if with_dead_letters
            else "dead letters kept (--with-dead-letters deletes them)")
    click.echo(f"deleted the consumer group of app {group!r} from queue(s) "
               f"{queue_ranges(removed) or 'none'}; {kept}")
