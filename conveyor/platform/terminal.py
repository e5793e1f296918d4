"""Text from messages and brokers, made safe to print on a terminal.

A stream key, a header or a content type is whatever a producer wrote: an escape
sequence in one (``\\x1b[31m``) would recolour or rewrite an operator's terminal, and a
carriage return or newline would forge log lines. What Conveyor prints for people — its
log lines, ``conveyor dlq show`` — shows such characters escaped, as ``repr`` would.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (C0, DEL, C1) but tab and newline."""
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{ord(char):02x}")


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\r``); ``lines``
    keeps newlines and tabs (a body, a traceback), else they are escaped too."""
    pattern = _CONTROL if lines else _CONTROL_OR_NEWLINE
    return pattern.sub(_escaped, text) if pattern.search(text) else text


class VisibleFormatter(logging.Formatter):
    """A formatter whose lines hold no control characters but the newlines and tabs of
    multi-line messages and tracebacks (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), lines=True)
