"""What the console's dead-letter and group pages do, through the functions the CLI uses.

Listing, replaying and purging go through :mod:`conveyor.platform.operations.dlq` and the adapter's
dead-letter methods exactly as ``conveyor dlq`` does (so a replay has the same once-only
guarantee: the letter is removed only once its message is stored, and a replay run twice
publishes once); deleting a group goes through
:func:`conveyor.platform.operations.groups.delete_app_group`, refused while the app looks alive.
Each call opens its own adapter and closes it, as a CLI command does, and is cut short
once the Redis refuses connections (:func:`~conveyor.console.probe.unless_refused`): the
answer then names the broker and, for a write action, says what was done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from conveyor.backends import command_adapter, coordination
from conveyor.console.probe import Refused, unless_refused
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config
from conveyor.platform.errors import BrokerConnectionError, ConveyorError, InvalidArgumentError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import StoredLetter
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.operations.dlq import (
    LetterFilter,
    letter_json,
    letters,
    purge,
    replay,
    stored_now,
)
from conveyor.platform.operations.groups import delete_app_group

T = TypeVar("T")

BODY_PREVIEW = 4096
"""Characters of a letter's body its detail shows."""
LIST_LIMIT = 200
"""Letters a list shows at most (the count says how many there are)."""
LIST_TEXT_MAX = 1024
"""Characters of a text a list's letter carries (its key, error...; the page shows 120):
200 letters of a producer's megabyte keys made a response of hundreds of MB. A letter's
detail has them whole (its body cut at :data:`BODY_PREVIEW`)."""


class RequestError(ConveyorError):
    """A request the console refuses, with the HTTP status it answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotFound(RequestError):
    """A letter or an app the request named is not there (HTTP 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(404, message)


@dataclass(frozen=True)
class Choice:
    """Which letters an action takes: ``ids``, or every letter the filters keep."""

    app: str
    ids: tuple[str, ...] = ()
    every: bool = False
    handler: str | None = None
    error_type: str | None = None
    stream: str | None = None
    known: bool = False
    """The console's ``--app``: an app even with no group and no letters (yet)."""

    def keeps(self, stored: StoredLetter) -> bool:
        if not LetterFilter(self.handler, self.error_type)(stored):
            return False
        if self.stream is None:
            return True
        stream = stored.letter.message.stream
        return self.stream in (stream.namespace, str(stream))


@dataclass
class Progress:
    """How far a write action got, for its answer should the broker go away midway."""

    taken: int = 0
    """Letters the action took to act on; none: it wrote nothing."""
    done: int = 0
    """Of them, those it is known to have acted on (a replay's: published and removed)."""


async def _on_adapter(config: Config, work: Callable[[QueueAdapter], Awaitable[T]],
                      known: Callable[[], str] | None = None) -> T:
    """``work`` on an adapter of its own; cut short once the Redis refuses connections,
    a :class:`BrokerConnectionError` naming it, then what ``known`` says was done."""

    async def opened() -> T:
        adapter = command_adapter(config)
        try:
            return await work(adapter)
        finally:
            await adapter.close()

    try:
        return await unless_refused(config, opened())
    except Refused as exc:
        said = [str(exc), *([known()] if known is not None else [])]
        if not exc.stopped:
            said.append("the console could not stop the action: it may go on if redis "
                        "is back within [redis] retry_max_s")
        raise BrokerConnectionError("; ".join(said)) from None


async def unknown_app(adapter: QueueAdapter, config: Config, app: str) -> str | None:
    """Why ``app`` is no app of this broker — no dead letters and no consumer group on any
    queue: a typo, most likely, whose empty list would read as an app with nothing to fix
    — or None when it is one."""
    if await adapter.dead_letters.count(app):
        return None
    groups = sorted({info.group for info in await adapter.groups.on(range(config.queues.total))})
    if app in groups:
        return None
    return (f"no app {app!r} on this broker: it has no consumer group and no dead letters "
            f"(a typo, or an app that never ran; apps here: {', '.join(groups) or 'none'})")


async def _require_app(adapter: QueueAdapter, config: Config, app: str) -> None:
    reason = await unknown_app(adapter, config, app)
    if reason is not None:
        raise NotFound(reason)


async def require_app(config: Config, app: str) -> None:
    """Refuse (:class:`NotFound`) an app :func:`unknown_app` names."""
    await _on_adapter(config, lambda adapter: _require_app(adapter, config, app))


async def list_letters(config: Config, choice: Choice,
                       limit: int = LIST_LIMIT) -> dict[str, Any]:
    """The letters the filters keep, oldest first, and how many the app has in all; an
    unknown app (:func:`unknown_app`) unless ``choice.known`` is a :class:`NotFound`."""

    async def work(adapter: QueueAdapter) -> dict[str, Any]:
        found = []
        async for stored in letters(adapter, choice.app):
            if choice.keeps(stored):
                found.append(_listed(letter_json(stored)))
                if len(found) >= limit:
                    break
        total = await adapter.dead_letters.count(choice.app)
        if not total and not choice.known:
            await _require_app(adapter, config, choice.app)
        return {"app": choice.app, "letters": found, "total": total, "limit": limit}

    return await _on_adapter(config, work)


def _listed(shown: dict[str, Any]) -> dict[str, Any]:
    """A letter as a list serves it: no headers or raw fields (the detail has them), and
    each text cut at :data:`LIST_TEXT_MAX`, its whole length in ``cut`` (by name)."""
    shown.pop("headers", None)
    shown.pop("raw_fields", None)
    cut = {name: len(value) for name, value in shown.items()
           if isinstance(value, str) and len(value) > LIST_TEXT_MAX}
    for name in cut:
        shown[name] = shown[name][:LIST_TEXT_MAX]
    if cut:
        shown["cut"] = cut
    return shown


async def show_letter(config: Config, app: str, letter_id: str, *,
                      known: bool = False) -> dict[str, Any]:
    """One letter in full, its body cut to :data:`BODY_PREVIEW` characters."""

    async def work(adapter: QueueAdapter) -> StoredLetter | None:
        stored = await adapter.dead_letters.find(app, letter_id)
        if stored is None and not known:
            await _require_app(adapter, config, app)
        return stored

    stored = await _on_adapter(config, work)
    if stored is None:
        raise NotFound(f"no dead letter {letter_id!r} of app {app!r} (replayed or purged?)")
    shown = letter_json(stored, body=True)
    for name in ("body", "body_base64"):
        if name in shown and len(shown[name]) > BODY_PREVIEW:
            shown[f"{name}_cut_at"] = BODY_PREVIEW
            shown[name] = shown[name][:BODY_PREVIEW]
    trace = stored.letter.message.headers.get("traceparent", "")
    shown["trace_id"] = trace.split("-")[1] if trace.count("-") == 3 else None
    return shown


async def _chosen(adapter: QueueAdapter, config: Config, choice: Choice,
                  progress: Progress) -> AsyncIterator[StoredLetter]:
    """``choice.every``: the letters stored now that it keeps, read a page at a time as
    the caller acts on them (an unknown app: :func:`_after_none`); else its ids, each
    found first. Each counted in ``progress.taken`` as the caller takes it."""
    if choice.every:
        async for stored in stored_now(adapter, choice.app, choice.keeps):
            progress.taken += 1
            yield stored
    else:
        for stored in await _found(adapter, config, choice):
            progress.taken += 1
            yield stored


async def _found(adapter: QueueAdapter, config: Config, choice: Choice) -> list[StoredLetter]:
    """The letters of ``choice.ids`` that it keeps; :class:`NotFound` when one is not
    stored (nothing done)."""
    found = {i: await adapter.dead_letters.find(choice.app, i) for i in choice.ids}
    missing = [i for i, s in found.items() if s is None]
    if missing:
        if not choice.known:
            await _require_app(adapter, config, choice.app)
        raise NotFound(f"no dead letter {', '.join(missing)} of app {choice.app!r}; "
                       "nothing was done")
    return [s for s in found.values() if s is not None and choice.keeps(s)]


async def _after_none(adapter: QueueAdapter, config: Config, choice: Choice) -> None:
    """An action on every letter that found none: :class:`NotFound` for an unknown app
    (nothing was done either way)."""
    if choice.every and not choice.known:
        await _require_app(adapter, config, choice.app)


def _replay_known(progress: Progress) -> Callable[[], str]:
    """What a replay cut short by a refusal did: a letter is replayed by one script that
    publishes its message and removes it, and a replay run again skips what is gone."""
    def said() -> str:
        if not progress.taken:
            return "nothing was replayed"
        return (f"{progress.done} letter(s) were replayed before it did; every other "
                "letter chosen is still stored, or was published once and removed as the "
                "connection went: replay again to finish (no letter is published twice)")
    return said


def _purge_known(progress: Progress) -> Callable[[], str]:
    """What a purge cut short by a refusal did: the letters of the calls that answered
    are counted; each other letter chosen is deleted or still stored."""
    def said() -> str:
        if not progress.taken:
            return "nothing was purged"
        return (f"{progress.done} letter(s) were purged before it did; every other letter "
                "chosen is deleted or still stored: purge again to finish (purging a "
                "letter twice deletes it once)")
    return said


async def replay_letters(config: Config, choice: Choice) -> dict[str, Any]:
    """Replay the chosen letters as ``conveyor dlq replay`` does."""
    mapper = HashRingQueueMapper(config.queues.total)
    progress = Progress()

    def replayed(_: str, __: SequenceToken) -> None:
        progress.done += 1

    async def work(adapter: QueueAdapter) -> dict[str, Any]:
        report = await replay(adapter, mapper, choice.app,
                              _chosen(adapter, config, choice, progress), replayed)
        if not (report.replayed or report.skipped or report.gone):
            await _after_none(adapter, config, choice)
        return {"replayed": [[i, str(token)] for i, token in report.replayed],
                "skipped": [list(s) for s in report.skipped], "gone": report.gone}

    return await _on_adapter(config, work, _replay_known(progress))


async def purge_letters(config: Config, choice: Choice) -> dict[str, Any]:
    """Delete the chosen letters for good, as ``conveyor dlq purge`` does."""
    progress = Progress()

    def purged(deleted: int) -> None:
        progress.done += deleted

    async def work(adapter: QueueAdapter) -> dict[str, Any]:
        report = await purge(adapter, choice.app, _chosen(adapter, config, choice, progress),
                             on_purged=purged)
        if not report.matched:
            await _after_none(adapter, config, choice)
        return {"purged": report.purged}

    return await _on_adapter(config, work, _purge_known(progress))


async def delete_group(config: Config, app: str) -> dict[str, Any]:
    """Remove a dead app's group from every queue (refused while it looks alive); its
    dead letters are kept."""

    async def work(adapter: QueueAdapter) -> list[int]:
        membership, leases = coordination(config, app)
        try:
            return await delete_app_group(adapter, membership, leases, app,
                                          range(config.queues.total))
        finally:
            await membership.close()
            await leases.close()

    removed = await _on_adapter(config, work, lambda: (
        "the group is gone from every queue, some or none: delete it again to finish "
        "(its dead letters are kept)"))
    return {"app": app, "removed_from": removed}


def check_text(name: str, value: Any, *, required: bool = False,
               max_len: int = 200) -> str | None:
    """A short printable string from a request, or an :class:`InvalidArgumentError`
    naming the field."""
    if value is None or value == "":
        if required:
            raise InvalidArgumentError(f"{name}: required")
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name}: expected a string")
    if len(value) > max_len or not value.isprintable():
        raise InvalidArgumentError(f"{name}: at most {max_len} printable characters")
    return value


def check_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) > 1000:
        raise InvalidArgumentError("ids: expected a list of at most 1000 letter ids")
    ids = tuple(check_text("ids[]", i, required=True) or "" for i in value)
    return tuple(dict.fromkeys(ids))
