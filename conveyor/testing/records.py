"""What a :class:`~conveyor.testing.TestWorker` saw: one :class:`Record` per message and
handler, its :class:`Attempt` s, and the report that names failures."""

from __future__ import annotations

import enum
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec

from conveyor.platform.errors import ConveyorError
from conveyor.platform.ids import shown_name
from conveyor.platform.message import CONTENT_MSGPACK, DeadLetter, Message

_PACKAGE = Path(__file__).resolve().parents[1]
_MACHINERY = tuple(str(_PACKAGE / room) for room in ("platform", "workers", "testing"))
"""Frames under these directories are Conveyor's delivery path, not the user's code."""


class Outcome(enum.Enum):
    """How one message ended for one handler (or for the app, when no handler took it)."""

    HANDLED = "handled"
    """The handler returned (on its first attempt or after retries)."""
    DEAD_LETTERED = "dead-lettered"
    """Stored as a dead letter: the last attempt failed, or the body did not decode, or
    (``[dead_letters] unroutable = "dead-letter"``) no handler subscribes to it."""
    SKIPPED = "skipped"
    """No handler of the app subscribes to its namespace: acknowledged, not handled."""
    DEDUPLICATED = "deduplicated"
    """An ``idempotent=True`` handler had completed this message id already: not run."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call of a handler (with the app's interceptors around it) on one message."""

    number: int
    """1 for the first call, 2 for the first retry, ..."""
    error: Exception | None
    """What the call raised; None when it returned."""
    duration_s: float


@dataclass(frozen=True, slots=True)
class Record:
    """One settled message for one handler: what was published, what happened to it.

    ``handler`` is the handler's name (``module.function`` unless declared with
    ``name=``), or ``""`` for a message no handler took. ``attempts`` are the calls
    the kit saw, in order; a batch handler's calls are per batch, so its records have
    none (see :meth:`TestWorker.batches <conveyor.testing.TestWorker.batches>`) and a
    message whose body did not decode has none either.
    """

    message: Message
    handler: str
    outcome: Outcome
    attempts: tuple[Attempt, ...]
    letter: DeadLetter | None
    body: Any
    """The body as the handler received it (its declared type: a Struct, dict, ...);
    for a message no handler took, or one that did not decode, the JSON or msgpack value
    if the bytes are one, else the bytes."""

    @property
    def namespace(self) -> str:
        return self.message.stream.namespace

    @property
    def key(self) -> str:
        return self.message.stream.key

    @property
    def retried(self) -> bool:
        """More than one call was made."""
        return len(self.attempts) > 1 or (self.letter is not None and self.letter.attempts > 1)

    @property
    def error(self) -> Exception | None:
        """The exception of the last failed call, if any call failed."""
        failed = [a.error for a in self.attempts if a.error is not None]
        return failed[-1] if failed else None

    def describe(self) -> str:
        """One line: outcome, stream, handler, attempts and the error."""
        who = self.handler.rpartition(".")[2] or "(no handler)"
        line = f"{self.outcome.value:<13} {shown(self.namespace)}/{shown(self.key)} {who}"
        calls = self.letter.attempts if self.letter is not None else len(self.attempts)
        if calls:
            line += f", {calls} attempt{'s' if calls != 1 else ''}"
        if self.letter is not None:
            line += f": {self.letter.reason}"
        elif (error := self.error) is not None:
            line += f" (failed before: {type(error).__name__}: {error})"
        return line


def shown(name: str) -> str:
    """A namespace or stream key as a report shows it: as is when printable, else
    escaped (a newline or a terminal escape in a key must not break a line); a long one
    cut short (:func:`~conveyor.platform.ids.shown_name`)."""
    return shown_name(name)


def raw_body(message: Message) -> Any:
    """A body's JSON or msgpack value, else its bytes (for messages no handler decoded)."""
    try:
        if message.content_type == CONTENT_MSGPACK:
            return msgspec.msgpack.decode(message.body)
        return msgspec.json.decode(message.body)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        return message.body


def report(records: Iterable[Record], *, tracebacks: bool = False) -> str:
    """The records as lines; with ``tracebacks``, each failed call's traceback below."""
    lines: list[str] = []
    for record in records:
        lines.append(record.describe())
        if not tracebacks:
            continue
        for attempt in record.attempts:
            if attempt.error is None:
                continue
            lines.append(f"  attempt {attempt.number} raised:")
            lines.extend("    " + part for part in user_traceback(attempt.error).splitlines())
    return "\n".join(lines)


def trimmed(error: BaseException) -> BaseException:
    """``error``, its traceback without the frames of Conveyor's delivery path (kept whole
    if no other frame is left: then the error is Conveyor's). The kit raises its
    findings from it, so a failing test shows the handler's lines, not the chain's,
    wherever the handler's module is (pytest prunes a cause only to the test's file)."""
    kept: list[TracebackType] = []
    tb = error.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_MACHINERY):
            kept.append(tb)
        tb = tb.tb_next
    if not kept:
        return error
    rebuilt: TracebackType | None = None
    for tb in reversed(kept):
        rebuilt = TracebackType(rebuilt, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return error.with_traceback(rebuilt)


def user_traceback(error: BaseException) -> str:
    """``error``'s traceback without the frames of Conveyor's own delivery path (all of
    them if no other frame is left: then the error is Conveyor's)."""
    shown = traceback.TracebackException.from_exception(error)
    frames = [f for f in shown.stack if not f.filename.startswith(_MACHINERY)]
    if frames:
        shown.stack = traceback.StackSummary.from_list(frames)
    return "".join(shown.format()).rstrip()


class NotSettled(ConveyorError, TimeoutError):
    """``settle()`` ran out of time; the message names what is still unsettled."""


class DeadLettersFound(ConveyorError, AssertionError):
    """``settle()`` found messages dead-lettered (pass ``raise_on_dead_letters=False``
    when that is what the test expects). ``records`` are those messages' records; the
    first failure's exception is the ``__cause__``, so pytest shows its traceback."""

    def __init__(self, message: str, records: list[Record]) -> None:
        super().__init__(message)
        self.records = records


class StartupHookFailed(ConveyorError, AssertionError):
    """An ``@app.startup`` hook raised; its exception is the ``__cause__``."""


class WorkerStopped(ConveyorError, AssertionError):
    """A handler raised ``KeyboardInterrupt`` or ``SystemExit``, which stops
    ``conveyor worker`` at once; the kit holds the call instead (its message stays
    unacknowledged) and ``settle()`` raises this, the handler's exception as the
    ``__cause__``: let through, it would end the test run. Or the daemon failed (its
    failure the cause). Nothing is handled after a stop, so every later ``settle()``
    raises it again, at once."""
