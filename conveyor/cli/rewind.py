"""``conveyor rewind``: move an app's position back to a sequence token or a time.

The checks (workers stopped, a group to move, not forward unless asked) and the move are
the adapter's (:meth:`conveyor.platform.adapter.QueueAdapter.rewind_queues`); this module
reads the target and says which refusals are the user's (exit 2).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import click

from conveyor.cli.common import (
    app_name,
    broker_config_option,
    fail,
    load_config_or_exit,
    refuse_embedded,
    run_command,
    usage,
)
from conveyor.platform.errors import ConveyorError

_CLOCK_TIME = re.compile(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?")
"""HH:MM[:SS], which a user means as a time of day, refused as a token."""


def _parse_rewind_target(text: str) -> Any:
    from datetime import UTC, datetime

    from conveyor.platform.ids import SequenceToken

    if _CLOCK_TIME.fullmatch(text):
        # As a token (QUEUE:MAJOR) "03:00" moved queue 3 to its first message; no
        # token Conveyor prints has this form (it always ends in -MINOR).
        raise click.BadParameter(
            f"{text!r} reads as a time of day, not a token: give a date and time "
            "(2026-11-22T03:00:00Z) or a token as `conveyor publish` prints it "
            "(3:1042-0)", param_hint="--to")
    head = text.split(":", 1)[0]
    if ":" in text and "T" not in text and ("-" not in head or head.startswith("-")):
        try:
            return SequenceToken.parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--to") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a token (QUEUE:MAJOR[-MINOR]) nor an ISO time "
            "(2026-11-22T10:00:00Z)", param_hint="--to",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


@click.command()
@broker_config_option
@click.option("--app", "group", required=True, callback=app_name,
              help="The app's name (its consumer group).")
@click.option("--to", "target", required=True,
              help="A sequence token (3:1042-0) or an ISO-8601 time, UTC unless it has "
                   "an offset (2026-11-22T10:00:00+01:00).")
@click.option("--queue", "queues", type=int, multiple=True,
              help="Queues to rewind to a time (default: all). A token names its own queue: "
                   "with one, --queue may name that queue only.")
@click.option("--allow-forward", is_flag=True,
              help="Also move a position forward, skipping the messages in between "
                   "(refused by default, for every queue, before any is moved).")
@click.option("--create-group", is_flag=True,
              help="Create the app's consumer group where it has none (refused by default: "
                   "a group nobody runs stops Redis trimming).")
def rewind(config_path: Path | None, group: str, target: str, queues: tuple[int, ...],
           allow_forward: bool, create_group: bool) -> None:
    """Move an app's position back to a token or a time.

    Run it with the app's workers stopped. Messages from that point on are delivered
    again (at least once: handlers must tolerate seeing them twice). A target ahead of
    the app's position (a later token, or a time after the last message) would skip
    messages never handled: it is a usage error (exit 2) unless --allow-forward is
    given, as is a time in the future or a Redis token past the stream's end (every
    message published until then would be skipped); with --allow-forward, what was
    skipped is printed. A Kafka token past the partition's end, or a time in the future
    on Kafka, is refused either way (exit 2): Kafka keeps no position there (give the
    current time to skip what the partitions hold). So is an app with no consumer group on the
    queues (a typo, or an app that never ran), unless --create-group is given. A
    queue that a worker of the app still owns (the adapter sees it, or its lease is
    held) is refused (exit 1). The embedded (memory) adapter is refused (exit 2): its
    positions live in the worker's process.

    \b
    Examples:
      conveyor rewind --app shop --to 2026-11-22T10:00:00Z \\
          --config configs/redis.toml
      conveyor rewind --app shop --to 3:1700000000000-3 \\
          --config configs/redis.toml
    """
    from conveyor.backends import command_adapter, lease_owners
    from conveyor.platform.errors import (
        ForwardRewindError,
        TokenRangeError,
        UnknownGroupError,
    )
    from conveyor.platform.ids import SequenceToken

    config = load_config_or_exit(config_path)
    to = _parse_rewind_target(target)
    refuse_embedded(config, "rewind", "its positions exist only there and vanish with it")
    total = config.queues.total
    bad = sorted({q for q in queues if not 0 <= q < total})
    if bad:
        raise click.BadParameter(f"no such queue(s) {bad}: the config's queues are "
                                 f"0-{total - 1}", param_hint="--queue")
    if isinstance(to, SequenceToken):
        if not 0 <= to.queue < total:
            raise click.BadParameter(f"token {to} names queue {to.queue}, which does not "
                                     f"exist: the config's queues are 0-{total - 1}",
                                     param_hint="--to")
        other = sorted(set(queues) - {to.queue})
        if other:
            raise click.BadParameter(
                f"queue(s) {other} given, but token {to} names queue {to.queue}: a token "
                "moves its own queue only (drop --queue, or give a token of that queue)",
                param_hint="--queue")
        chosen = [to.queue]
    else:
        chosen = list(dict.fromkeys(queues)) or list(range(total))

    async def run() -> list[str]:
        adapter = command_adapter(config)
        try:
            try:
                if isinstance(to, SequenceToken):  # before the broker is asked anything
                    adapter.check_token(to)
                else:
                    adapter.check_time(to)  # Kafka: no time in the future, ever
                    if to > time.time() and not allow_forward:
                        # On a queue the app had finished no message published so far
                        # lies in between, and Redis would set the position ahead of
                        # every message still to come (the Redis adapter says so too,
                        # skips_unpublished, by its server's clock).
                        raise click.BadParameter(
                            f"{target} is in the future: the app would skip every message "
                            "published until then; pass --allow-forward to skip them on "
                            "purpose", param_hint="--to")
                held = await lease_owners(config, group)
                return await adapter.rewind_queues(
                    chosen, group, to, allow_forward=allow_forward, create_group=create_group,
                    lease_owners=held)
            except (ForwardRewindError, TokenRangeError) as exc:
                raise click.BadParameter(str(exc), param_hint="--to") from None
        finally:
            await adapter.close()

    try:
        skipped = run_command(run())
    except UnknownGroupError as exc:
        usage(f"--app: {exc}")
    except ConveyorError as exc:
        fail(exc)
    click.echo(f"rewound {group} on queue(s) {chosen} to {target}")
    for line in skipped:
        click.echo(f"skipped on purpose (--allow-forward): {line}")
