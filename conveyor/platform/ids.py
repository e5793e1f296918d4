"""Value objects that name things: streams and positions in a queue."""

from __future__ import annotations

import re

import msgspec

from conveyor.platform.errors import InvalidArgumentError

POSITION_MAX = 2**64 - 1
"""The largest MAJOR or MINOR of a :class:`SequenceToken`'s text form: a Redis stream id's
two parts are unsigned 64-bit numbers. A backend may take less (a Kafka offset is a signed
64-bit number: :attr:`conveyor.platform.adapter.QueueAdapter.token_max`)."""

_TOKEN = re.compile(r"([0-9]+):([0-9]+)(?:-([0-9]+))?")
"""``QUEUE:MAJOR[-MINOR]``, ASCII digits only (no sign, space or ``_``, which ``int``
would take)."""

_MAX_DIGITS = len(str(POSITION_MAX))

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
"""Names that reach into a broker's key space (app names, which are consumer groups, and
Redis key prefixes): 1-128 ASCII letters, digits, ``_``, ``.``, ``-``. Check with
``NAME.fullmatch``: ``match`` against ``...$`` would accept a trailing newline."""


CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""A control character (C0, DEL): what one line of text a name is must not hold."""

NAMESPACE_MAX = 255
"""The longest namespace, in characters."""

KEY_MAX = 1024
"""The longest stream key, in characters."""


def namespace_problem(namespace: str) -> str | None:
    """What is wrong with ``namespace`` (a non-empty str), said of it as
    :func:`shown_name` shows it (which counts a long one's characters): "holds a control
    character ('\\n')"; or None: a namespace is one line of text, at most
    :data:`NAMESPACE_MAX` characters. It selects handlers, and goes into every message's
    metadata, and into the dead letters, log lines and metrics labels that name its
    handlers: a newline there forges a line, a NUL or 100 kB spoils a label. (Not UTF-8
    is the caller's to say: it says so of the key too.)"""
    if len(namespace) > NAMESPACE_MAX:
        return f"is longer than {NAMESPACE_MAX} characters, the most a namespace may be"
    found = CONTROL.search(namespace)
    if found is not None:
        return f"holds a control character ({found.group()!r}): a namespace is one line"
    return None


def namespace_refusal(namespace: object) -> str | None:
    """What is wrong with ``namespace``, a value of any type, as a namespace, said of it
    ("must be a non-empty string", "is not text UTF-8 can encode", or its
    :func:`namespace_problem`); or None: it is one a handler can be declared on and a
    client can publish to."""
    if not namespace or not isinstance(namespace, str):
        return "must be a non-empty string"
    try:
        namespace.encode()
    except UnicodeEncodeError:
        return "is not text UTF-8 can encode"
    return namespace_problem(namespace)


def shown_any(name: object) -> str:
    """A namespace or key given of any type, as a refusal of it shows it (``repr``, cut
    short: :func:`shown_name`)."""
    return shown_name(name, quoted=True) if isinstance(name, str) else f"{name!r:.100}"


def key_problem(key: str) -> str | None:
    """What is wrong with ``key`` (a str), said of it, or None: a stream key is any text
    of at most :data:`KEY_MAX` characters (control characters are data there, shown
    escaped). It is an id (an order's, a tenant's) that clients and workers remember
    per stream in their caches: hash a longer one."""
    if len(key) > KEY_MAX:
        return (f"is longer than {KEY_MAX:,} characters, the most a stream key may be (hash "
                "a longer one)")
    return None


def is_app_name(name: str) -> bool:
    """Whether ``name`` could be an app's (a consumer group Conveyor made): groups that
    other tools made on the same streams may be named anything."""
    return NAME.fullmatch(name) is not None


class StreamId(msgspec.Struct, frozen=True, array_like=True):
    """A stream: every message of one stream is delivered in order.

    ``namespace`` selects the handlers (``@app.handler("orders")``); ``key`` names the
    stream inside it (an order id, a tenant id, ...).
    """

    namespace: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.key}"

    def shown(self) -> str:
        """``namespace/key`` as an error message names the stream: each cut short
        (:func:`shown_name`)."""
        return f"{shown_name(self.namespace)}/{shown_name(self.key)}"


NAME_SHOWN_MAX = 100
"""The most characters of a namespace or stream key an error message shows: a broker
takes a key of a megabyte, and an error naming it in full was a megabyte long."""


def shown_name(text: str, *, quoted: bool = False) -> str:
    """A namespace, stream key or message id as an error message or a log line shows
    it (``quoted``: as ``repr``): its first :data:`NAME_SHOWN_MAX` characters, then how
    long it was; unquoted, escaped as ``repr`` escapes them when it holds what is not
    printable (a key is any text: a newline, a terminal escape or a U+2028 shown as it
    is broke the one line into two, the second posing as a line of its own)."""
    start = text if len(text) <= NAME_SHOWN_MAX else text[:NAME_SHOWN_MAX]
    shown = repr(start) if quoted else start if start.isprintable() else repr(start)[1:-1]
    return shown if start is text else f"{shown}… ({len(text):,} characters)"


class SequenceToken(msgspec.Struct, frozen=True, order=True, array_like=True):
    """A position inside one queue, comparable within that queue.

    Backends map their native positions onto ``(major, minor)``: a Kafka offset or a
    memory-log offset is ``(offset, 0)``; a Redis stream id ``1700000000000-3`` is
    ``(1700000000000, 3)``. Its text form ``queue:major-minor`` is what
    ``conveyor rewind --to`` accepts.
    """

    queue: int
    major: int
    minor: int = 0

    def __str__(self) -> str:
        return f"{self.queue}:{self.major}-{self.minor}"

    @classmethod
    def parse(cls, text: str) -> SequenceToken:
        """Parse ``queue:major[-minor]``, each a whole number from 0 to
        :data:`POSITION_MAX`; raises :class:`InvalidArgumentError` (a ``ValueError``)
        with the expected form."""
        if not isinstance(text, str):  # the pattern raised TypeError on bytes or a number
            raise InvalidArgumentError(
                f"not a sequence token: {text!r:.80} is {type(text).__name__}, not text "
                "(expected QUEUE:MAJOR[-MINOR], e.g. '3:1042-0')")
        found = _TOKEN.fullmatch(text)
        if found is None:
            raise InvalidArgumentError(
                f"not a sequence token: {_cut(text)!r} (expected QUEUE:MAJOR[-MINOR], whole "
                "numbers from 0, e.g. 3:1042-0)"
            )
        parts = found.group(1), found.group(2), found.group(3) or "0"
        for name, digits in zip(("QUEUE", "MAJOR", "MINOR"), parts, strict=True):
            # By length first: int() refuses more than 4300 digits.
            if len(digits.lstrip("0")) > _MAX_DIGITS or int(digits) > POSITION_MAX:
                raise InvalidArgumentError(
                    f"not a sequence token: {_cut(text)!r} ({name} is above "
                    f"{POSITION_MAX} = 2**64-1, the largest a position takes)"
                )
        queue, major, minor = map(int, parts)
        return cls(queue, major, minor)

def _cut(text: str, limit: int = 60) -> str:
    """``text``, cut short for a one-line message."""
    return text if len(text) <= limit else text[:limit] + "..."
