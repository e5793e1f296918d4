"""Text from messages and brokers, made safe to print on a terminal.

A stream key, a header or a content type is whatever a producer wrote: an escape
sequence in one (``\\x1b[31m``) would recolour or rewrite an operator's terminal, and a
carriage return or newline would forge log lines. What Conveyor prints for people — its
log lines, ``conveyor dlq show`` — shows such characters escaped, as ``repr`` would.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from typing import TextIO, cast

_UNICODE = "\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
"""Bidirectional controls, which reorder what a terminal shows (as the console's page
escapes them), and the line and paragraph separators, which end a line for
``str.splitlines`` and the tools built on it."""
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_UNICODE}]")
"""Control characters (C0, DEL, C1, the Unicode ones above) but tab and newline."""
_CONTROL_OR_NEWLINE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_UNICODE}]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(
        char, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\r``); ``lines``
    keeps newlines and tabs (a body, a traceback), else they are escaped too."""
    pattern = _CONTROL if lines else _CONTROL_OR_NEWLINE
    return pattern.sub(_escaped, text) if pattern.search(text) else text


LOG_VALUE_MAX = 2000
"""The most characters of one value a log line shows (a producer's 2 MB namespace made a
2 MB line): its start, then how long it was."""


def _cut(text: str) -> str:
    if len(text) <= LOG_VALUE_MAX:
        return text
    return f"{text[:LOG_VALUE_MAX]}… ({len(text):,} characters)"


class _Shown:
    """A log argument as ``%s`` or ``%r`` shows it, control characters escaped, cut at
    :data:`LOG_VALUE_MAX`."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return _cut(visible(str(self.value)))

    def __repr__(self) -> str:
        return _cut(visible(repr(self.value)))


class Lines(str):
    """A log argument of Conveyor's own making that has lines of its own (the stack the
    loop watchdog formats): shown as a traceback is, its newlines kept and its other
    control characters escaped. Never a producer's value, whose newline would forge a
    line."""

    __slots__ = ()


def _shown(value: object) -> object:
    if isinstance(value, int | float):
        return value  # %d, %.1f as given
    return visible(value, lines=True) if isinstance(value, Lines) else _Shown(value)


class VisibleFormatter(logging.Formatter):
    """A formatter whose lines hold no control characters (see the module docstring).

    The values a message is formatted with (``log.warning("... %s", key)``) show every
    one escaped, newlines included, so that none forges a line; the message's own text,
    a traceback and a :class:`Lines` value keep their newlines and tabs."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if args:
            record = logging.makeLogRecord(record.__dict__)
            record.args = ({k: _shown(v) for k, v in args.items()}
                           if isinstance(args, dict) else tuple(_shown(a) for a in args))
        return visible(super().format(record), lines=True)


class _KeptStream(io.TextIOBase):
    """See :func:`kept`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):  # a StringIO, click's CliRunner
            self._fd = None
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._spare: TextIO | None = None

    def _target(self) -> TextIO | None:
        if not getattr(self._stream, "closed", False):
            return self._stream
        if self._spare is None and self._fd is not None:
            try:  # kept open for the process's life, as sys.stderr is
                self._spare = open(self._fd, "w", buffering=1,  # noqa: SIM115
                                   encoding=self._encoding, errors="backslashreplace",
                                   closefd=False)
            except OSError:  # its descriptor closed too (os.close(2)): nowhere left
                self._fd = None
        return self._spare

    def write(self, text: str) -> int:
        target = self._target()
        # closed meanwhile (another thread), a pipe nobody reads: dropped
        with contextlib.suppress(OSError, ValueError):
            if target is not None:
                target.write(text)
        return len(text)

    def flush(self) -> None:
        target = self._target()
        with contextlib.suppress(OSError, ValueError):
            if target is not None:
                target.flush()

    def isatty(self) -> bool:
        target = self._target()
        with contextlib.suppress(OSError, ValueError):
            return target is not None and target.isatty()
        return False


def kept(stream: TextIO) -> TextIO:
    """``stream`` (a process's ``sys.stderr``, taken before any app code runs) for the
    lines Conveyor itself writes — its log, a worker's ``ready`` and ``drained`` lines —
    kept from what handler code does to it: closed (``sys.stderr.close()``), they go on
    to its file descriptor; replaced (``sys.stderr = None``, a ``StringIO``), they go on
    where they went; a write that fails (its descriptor closed too, a pipe nobody reads)
    is dropped. It never raises, so the worker's own next line cannot fail the code that
    writes it, nor the exit."""
    return cast(TextIO, _KeptStream(stream))
