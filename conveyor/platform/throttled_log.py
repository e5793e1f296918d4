"""Logging an event that may repeat per message: at most once per key per interval.

A hostile or broken producer can make every message of a queue fail the same way;
the log must stay readable and bounded (one line per kind of trouble per interval, with
how many more there were), never one line per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable


class ThrottledLog:
    """``log(level, key, message, *args)``: logged when ``key`` was not logged in the last
    ``interval_s``; otherwise counted, and the count is added to the key's next line.

    At most ``max_keys`` keys are remembered; past that, new keys share one key (so
    100,000 distinct namespaces still log a bounded number of lines).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 max_keys: int = 256) -> None:
        self._log = logger
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def log(self, level: int, key: Hashable, message: str, *args: object) -> bool:
        """Log or count one occurrence; True if it was logged."""
        if key not in self._last and len(self._last) >= self.max_keys:
            key = ("*overflow*",)
            message, args = "%s (more kinds than the log keeps apart)", (message % args,)
        held = self.admit(key)
        if held is None:
            return False
        self._log.log(level, message + held, *args)
        return True

    def admit(self, key: Hashable) -> str | None:
        """One occurrence of ``key``: None when it is to be counted, not logged (logged
        within the interval); else what its line ends with — ``""``, or how many more
        there were since it was last logged."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        more = self._suppressed.pop(key, 0)
        if not more or last is None:
            return ""
        return f" (and {more} more like it in the last {now - last:.0f}s)"


class RepeatFilter(logging.Filter):
    """A filter for a library's logger that repeats a line per occurrence: one record of
    each kind passes every ``interval_s()`` seconds (read at each record, so a module
    setting can change), ending with how many more there were (:meth:`ThrottledLog.admit`);
    the others are dropped. ``kind(record)`` says which kind a record is; None lets it
    pass as it is."""

    def __init__(self, kind: Callable[[logging.LogRecord], Hashable | None],
                 interval_s: Callable[[], float]) -> None:
        super().__init__()
        self._kind = kind
        self._interval_s = interval_s
        self._throttle = ThrottledLog(logging.getLogger(__name__), interval_s())

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._kind(record)
        if key is None:
            return True
        self._throttle.interval_s = self._interval_s()
        held = self._throttle.admit(key)
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg}{held}"
        return True


class EpisodeLog:
    """A fault an operator must fix (a store holding the wrong thing): logged as an error
    when first met, again only if its text changes, and once when it is over, as a
    warning — an error of the same text at each retry says nothing new."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self.what = what
        self._said: str | None = None

    def failed(self, exc: BaseException, then: str = "") -> None:
        """``exc`` met (again); ``then`` ends the line with what happens meanwhile."""
        text = str(exc)
        if text != self._said:
            self._said = text
            self._log.error("%s: %s%s", self.what, text, then)

    def ok(self) -> None:
        if self._said is not None:
            self._said = None
            self._log.warning("%s: working again", self.what)
