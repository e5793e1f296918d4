"""``conveyor dlq``: an app's dead letters — list, show, replay, purge.

Thin like the rest of the CLI: the work is in :mod:`conveyor.platform.operations.dlq` and the
adapters' dead-letter methods; the table in :mod:`conveyor.cli.render`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from conveyor.backends import command_adapter
from conveyor.cli.common import (
    FilePath,
    app_name,
    fail,
    load_config_or_exit,
    run_command,
    usage,
    warn,
)
from conveyor.cli.render import letters_view, print_table
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config
from conveyor.platform.errors import ConveyorError, InvalidArgumentError
from conveyor.platform.letters import StoredLetter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.operations.dlq import (
    LetterFilter,
    Letters,
    PurgeReport,
    ReplayReport,
    letter_json,
    letters,
    stored_now,
)
from conveyor.platform.operations.dlq import purge as purge_letters
from conveyor.platform.operations.dlq import replay as replay_letters
from conveyor.platform.terminal import visible

T = TypeVar("T")

GONE_SHOWN = 10
"""Ids of letters another run replayed or purged that a replay's warning names."""

HINT_SCAN = 10_000
"""Letters read for the values a filter could have taken, when it kept none."""
HINT_SHOWN = 5
"""Values named in that warning."""

TABLE_MAX = 10_000
"""The most letters ``dlq list`` shows as a table (``--limit``): rich lays a table out
whole before its first line, and 50,000 rows took 16 s and 290 MB (113 s on a loaded
machine). ``--json``, encoded a letter at a time as the pages come, takes any limit."""

MEMORY_REFUSED = (
    "the memory adapter keeps dead letters inside the worker's own process, where this "
    "command cannot reach them; use --config with a redis or kafka config (e.g. "
    "configs/redis.toml), or read them in-process with adapter.dead_letters.page()"
)

ID_REFUSED = "--id: {}; nothing was done"
"""A malformed ``--id`` of replay or purge, refused."""


def _options(fn: Callable[..., None]) -> Callable[..., None]:
    """--config and --app, as every other command that reads an app's state has them."""
    fn = click.option("--app", "group", required=True, callback=app_name,
                      help="The app's name (its consumer group).")(fn)
    return click.option(
        "--config", "config_path",
        type=FilePath(exists=True, dir_okay=False, path_type=Path),
        help="TOML config file (see configs/): a redis or kafka one.",
    )(fn)


def _filters(fn: Callable[..., None]) -> Callable[..., None]:
    fn = click.option("--handler", default=None, help="Only letters of this handler.")(fn)
    fn = click.option("--namespace", default=None,
                      help="Only letters of messages of this namespace (e.g. orders).")(fn)
    return click.option("--error-type", default=None,
                        help="Only letters of this error type (e.g. ValueError).")(fn)


def _limit(fn: Callable[..., None]) -> Callable[..., None]:
    return click.option("--limit", type=click.IntRange(min=1), default=None,
                        help="With --all: at most this many letters (after filters), "
                             "oldest first.")(fn)


def _load(config_path: Path | None) -> Config:
    config = load_config_or_exit(config_path)
    if config.queues.adapter == "memory":
        usage(MEMORY_REFUSED)
    return config


def _run(config: Config, group: str, work: Callable[[QueueAdapter], Awaitable[T]],
         ids: tuple[str, ...] = (), refused: str = "ID: {}") -> T:
    """Run ``work(adapter)`` on a fresh adapter, after a warning for each fault of the
    app's dead-letter store (a Redis key of another type, a compacted Kafka topic: the
    command goes on, reading it as empty or as it is); bad input exits 2, a failure 1.
    The letter ``ids`` given are checked first, before the broker is asked anything: a
    malformed one is the only line said, ``refused`` with the reason."""

    async def run() -> T:
        adapter = command_adapter(config)
        try:
            for letter_id in ids:
                try:
                    adapter.dead_letters.check_id(letter_id)
                except InvalidArgumentError as exc:
                    usage(refused.format(exc))
            for problem in await adapter.store_problems([], [group]):
                warn(problem.warning)
            await _warn_if_unknown(adapter, config, group)
            return await work(adapter)
        finally:
            await adapter.close()

    try:
        return run_command(run())
    except InvalidArgumentError as exc:
        usage(str(exc))
    except ConveyorError as exc:
        fail(exc)


async def _warn_if_unknown(adapter: QueueAdapter, config: Config, group: str) -> None:
    """A warning for an ``--app`` with no letters and no consumer group: most likely a
    typo, whose "0 letter(s)" would otherwise read as an app with nothing to fix."""
    if await adapter.dead_letters.count(group):
        return
    infos = await adapter.groups.on(range(config.queues.total))
    if any(info.group == group for info in infos):
        return
    others = ", ".join(sorted({info.group for info in infos})) or "none"
    warn(f"--app {group!r} has no dead letters and no consumer group on any queue (a "
         f"typo, or an app that never ran; groups here: {others})")


async def _warn_unmatched(adapter: QueueAdapter, group: str, keep: LetterFilter) -> None:
    """When the filters kept no letter: a warning for each filter whose value no letter
    has, naming the values the letters have and the one meant, if it is plain (a
    handler's short name, `on_order` for `shop.on_order`; a slip of case or spelling):
    otherwise `replay --all --handler on_order` replays nothing and says only "0"."""
    given = {"--handler": keep.handler, "--error-type": keep.error_type,
             "--namespace": keep.namespace}
    if all(value is None for value in given.values()):
        return
    seen: dict[str, set[str]] = {name: set() for name in given}
    async for stored in letters(adapter, group, limit=HINT_SCAN):
        letter = stored.letter
        seen["--handler"].add(letter.handler)
        seen["--error-type"].add(letter.error_type)
        seen["--namespace"].add(letter.message.stream.namespace)
    for name, value in given.items():
        if value is None or value in seen[name] or not seen[name]:
            continue
        values = sorted(v for v in seen[name] if v)  # a letter no handler took has ""
        listed = ", ".join(values[:HINT_SHOWN]) or "-"
        if len(values) > HINT_SHOWN:
            listed += f" and {len(values) - HINT_SHOWN} more"
        close = ([v for v in values if v.rpartition(".")[2] == value]
                 or [v for v in values if v.lower() == value.lower()]
                 or difflib.get_close_matches(value, values, n=1, cutoff=0.6))
        warn(f"{name} {value!r} matches no letter (their {name[2:].replace('-', ' ')}s: "
             f"{listed})" + (f"; did you mean {name} {close[0]}?" if close else ""))


async def _chosen(adapter: QueueAdapter, group: str, ids: tuple[str, ...], every: bool,
                  keep: LetterFilter, limit: int | None) -> Letters:
    """The letters ``--all`` / ``--id`` name, filtered. ``--all``: at most ``limit`` of
    those stored now, read a page at a time as the caller acts on them (a million
    letters are never held at once); ``--id``: each found first, an id not stored exits
    2 with nothing done."""
    if every:
        return stored_now(adapter, group, keep, limit)
    try:
        found = {i: await adapter.dead_letters.find(group, i) for i in dict.fromkeys(ids)}
    except InvalidArgumentError as exc:  # a malformed id
        usage(ID_REFUSED.format(exc))
    missing = [i for i, s in found.items() if s is None]
    if missing:
        usage(f"--id: no dead letter {', '.join(missing)} of app {group!r} (see "
               "`conveyor dlq list`); nothing was done")
    # An id the filters drop would be left without a word ("replayed 0 letter(s)"), as
    # a letter not stored would be without the check above: refused the same way.
    dropped = [i for i, s in found.items() if s is not None and not keep(s)]
    if dropped:
        usage(f"--id: letter(s) {', '.join(dropped)} do not match --handler/--namespace/"
              "--error-type (`conveyor dlq show ID` gives a letter's); nothing was done")
    return [s for s in found.values() if s is not None]


def _one_of(every: bool, ids: tuple[str, ...], limit: int | None) -> None:
    if every == bool(ids):
        usage("give either --all or --id ID (repeatable), not both or neither")
    if limit is not None and not every:
        usage("--limit goes with --all (--id names the letters already)")


@click.group("dlq")
def dlq() -> None:
    """An app's dead letters: list, show, replay, purge.

    On redis and kafka. Letters are stored in the Redis stream PREFIX:dlq:APP, or the
    Kafka topic TOPIC.conveyor-dlq; see docs/dead-letters.md.

    \b
    Examples:
      conveyor dlq list --app shop --config configs/redis.toml
      conveyor dlq replay --all --app shop --config configs/redis.toml
    """


@dlq.command("list")
@_options
@_filters
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help=f"Show at most this many letters, oldest first (a table: at most "
                   f"{TABLE_MAX:,}; --json: any number).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, errors in full.")
@click.option("--wide", is_flag=True,
              help="Handler, error type and letter replayed apart: for a wide terminal.")
def list_letters(config_path: Path | None, group: str, handler: str | None,
                 namespace: str | None, error_type: str | None, limit: int, as_json: bool,
                 wide: bool) -> None:
    """One line per letter: id, stream, time, error.

    The error is cut to the terminal's width (`dlq show ID` and --json give it whole).

    \b
    Examples:
      conveyor dlq list --app shop --config configs/redis.toml
      conveyor dlq list --app shop --error-type ValueError \\
          --config configs/redis.toml
      conveyor dlq list --app shop --config configs/redis.toml --json
    """
    if limit > TABLE_MAX and not as_json:
        usage(f"--limit {limit}: a table shows at most {TABLE_MAX:,} letters (rich lays it "
              "out whole before printing); --json lists any number")
    config = _load(config_path)
    keep = LetterFilter(handler, error_type, namespace)

    async def encoded(adapter: QueueAdapter) -> list[str]:
        # Each letter's JSON as its page comes, not the letters (a third of the memory);
        # printed once all are read, so that an error midway leaves stdout empty.
        found = [json.dumps(letter_json(s)) async for s in letters(adapter, group, keep, limit)]
        if not found:
            await _warn_unmatched(adapter, group, keep)
        return found

    if as_json:
        click.echo(f"[{', '.join(_run(config, group, encoded))}]")
        return

    async def work(adapter: QueueAdapter) -> tuple[list[StoredLetter], int]:
        # One past the limit: whether --limit left any out (the total counts letters the
        # filters drop too).
        found = [s async for s in letters(adapter, group, keep, limit + 1)]
        if not found:
            await _warn_unmatched(adapter, group, keep)
        return found, await adapter.dead_letters.count(group)

    found, total = _run(config, group, work)
    more, found = len(found) > limit, found[:limit]
    from rich.console import Console

    filtered = handler is not None or error_type is not None or namespace is not None
    print_table(letters_view(found, group, total, wide, Console().width, more=more,
                             filtered=filtered,
                             shows_more="--json" if limit == TABLE_MAX else "--limit"),
                whole_rows=wide)


@dlq.command("show", short_help="One letter in full: reason, metadata, headers, body.")
@click.argument("letter_id", metavar="ID")
@_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(letter_id: str, config_path: Path | None, group: str, as_json: bool) -> None:
    """One letter in full: the reason, the message's metadata, headers and body.

    \b
    Examples:
      conveyor dlq show 1700000000000-0 --app shop --config configs/redis.toml
    """
    config = _load(config_path)

    async def work(adapter: QueueAdapter) -> StoredLetter | None:
        try:
            return await adapter.dead_letters.find(group, letter_id)
        except InvalidArgumentError as exc:  # a malformed id
            usage(f"ID: {exc}")

    stored = _run(config, group, work, (letter_id,))
    if stored is None:
        usage(f"no dead letter {letter_id} of app {group!r} (see `conveyor dlq list`)")
    shown = letter_json(stored, body=True)
    if as_json:
        click.echo(json.dumps(shown))
        return
    for name, value in shown.items():  # producers' text, escaped for the terminal
        if name == "headers":
            value = ", ".join(f"{visible(k)}={visible(v)}" for k, v in value.items()) or "-"
        elif name == "raw_fields":  # an undecodable entry's fields, as it held them
            value = ", ".join(f"{visible(k)}={'(null)' if v is None else visible(v)}"
                              for k, v in value) or "-"
        elif isinstance(value, str):
            value = visible(value, lines=name == "body")
        blank = value is None or (value == "" and name in ("handler", "error_type"))
        click.echo(f"{name + ':':<15}{'-' if blank else value}")


@dlq.command("replay", short_help="Publish letters' messages again; remove the letters.")
@_options
@click.option("--all", "every", is_flag=True, help="Every letter of the app (after filters).")
@click.option("--id", "ids", multiple=True, metavar="ID", help="This letter (repeatable).")
@_filters
@_limit
@click.option("--batch", type=click.IntRange(min=1), default=100, show_default=True,
              help="Letters replayed per round of broker calls.")
def replay(config_path: Path | None, group: str, every: bool, ids: tuple[str, ...],
           handler: str | None, namespace: str | None, error_type: str | None,
           limit: int | None, batch: int) -> None:
    """Publish letters' messages to their streams again; remove the letters.

    Each message goes back as it was published (body, stream, content type, headers,
    trace context, cv-id) with the header cv-replay-of = the letter's id; the letter is
    removed only once the publish is confirmed. Interrupted, run it again: no letter is
    lost or published twice. A message that fails again becomes a new letter whose
    replay-of names this one. Undecodable and bare letters are skipped (and kept).

    \b
    Examples:
      conveyor dlq replay --all --app shop --config configs/redis.toml
      conveyor dlq replay --id 1700000000000-0 --app shop \\
          --config configs/redis.toml
      conveyor dlq replay --all --handler shop.on_order --app shop \\
          --config configs/redis.toml
    """
    _one_of(every, ids, limit)
    config = _load(config_path)
    mapper = HashRingQueueMapper(config.queues.total)
    keep = LetterFilter(handler, error_type, namespace)

    async def work(adapter: QueueAdapter) -> ReplayReport:
        chosen = await _chosen(adapter, group, ids, every, keep, limit)
        report = await replay_letters(
            adapter, mapper, group, chosen,
            on_replayed=lambda i, token: click.echo(f"replayed {i} -> {token}"), batch=batch,
        )
        if every and not (report.replayed or report.skipped or report.gone):
            await _warn_unmatched(adapter, group, keep)
        return report

    report = _run(config, group, work, ids, ID_REFUSED)
    for letter_id, why in report.skipped:
        warn(f"skipped {letter_id}: {why}")
    if report.gone:  # another replay (or a purge) at the same time: one line, not one each
        shown = ", ".join(report.gone[:GONE_SHOWN])
        more = len(report.gone) - GONE_SHOWN
        warn(f"{len(report.gone)} letter(s) were gone when this replay came to them "
             f"(replayed or purged by another run meanwhile): {shown}"
             + (f" and {more} more" if more > 0 else ""))
    click.echo(f"replayed {len(report.replayed)} letter(s) of app {group!r}"
               + (f"; {len(report.skipped)} skipped and kept" if report.skipped else "")
               + (f"; {len(report.gone)} gone meanwhile" if report.gone else ""))


@dlq.command("purge")
@_options
@click.option("--all", "every", is_flag=True, help="Every letter of the app (after filters).")
@click.option("--id", "ids", multiple=True, metavar="ID", help="This letter (repeatable).")
@_filters
@_limit
@click.option("--yes", is_flag=True, help="Really delete them (required).")
def purge(config_path: Path | None, group: str, every: bool, ids: tuple[str, ...],
          handler: str | None, namespace: str | None, error_type: str | None,
          limit: int | None, yes: bool) -> None:
    """Delete letters for good.

    Kafka: recorded as purged; the records stay until the topic's retention removes
    them.

    \b
    Examples:
      conveyor dlq purge --id 1700000000000-0 --yes --app shop \\
          --config configs/redis.toml
      conveyor dlq purge --all --error-type DecodeError --yes --app shop \\
          --config configs/redis.toml
    """
    _one_of(every, ids, limit)
    if not yes:
        usage("purge deletes dead letters for good: add --yes to confirm")
    config = _load(config_path)
    keep = LetterFilter(handler, error_type, namespace)

    async def work(adapter: QueueAdapter) -> PurgeReport:
        report = await purge_letters(
            adapter, group, await _chosen(adapter, group, ids, every, keep, limit))
        if every and not report.matched:
            await _warn_unmatched(adapter, group, keep)
        return report

    purged = _run(config, group, work, ids, ID_REFUSED).purged
    click.echo(f"purged {purged} letter(s) of app {group!r}")
