"""How a dead letter is stored: readable by any client of the broker, always storable.

Every adapter stores a letter as the message itself, in the queue's own wire format
(Redis: an entry's fields; Kafka: a record's key, headers and value), *preceded* by
these fields / headers, always all of them and always in this order::

    cv-dl-v           1 (this layout's version)
    cv-dl-app         the app (consumer group) that dead-lettered it
    cv-dl-handler     the handler's name; empty for a message no handler took
    cv-dl-error-type  the exception's class, or Undecodable / Unroutable
    cv-dl-error       the error text (at most 4,096 characters)
    cv-dl-attempts    handler calls made (0: it never reached the handler)
    cv-dl-at          when, in milliseconds since the epoch
    cv-dl-token       where it was in its queue: QUEUE:MAJOR-MINOR
    cv-dl-form        full | minimal | bare (see DeadLetter)
    cv-dl-replay-of   the letter this message was replayed from (its cv-replay-of
                      header), empty for a message never replayed  [version 2]

So ``redis-cli XRANGE conveyor:dlq:APP - +`` or ``kcat -C -t TOPIC.conveyor-dlq -f
'%h %s'`` shows the reason next to the body as it was published, and replaying a letter
means dropping the ``cv-dl-*`` part and publishing the rest. An undecodable message's
own fields and headers follow byte for byte, as the broker held them. Readers take the
first :func:`meta_count` pairs as the letter's (9 in version 1, 10 in version 2) and
everything after as the message's, so a message carrying a field that looks like one of
these cannot pass for it.

Telling second letters apart: a replayed message that fails again is a new letter whose
``cv-dl-replay-of`` names the letter it came from (and whose ``cv-dl-token`` is its new
place in the queue); a rewind over a poison message stores a second letter with the same
``cv-id`` *and* the same ``cv-dl-token`` as the first, and an empty ``cv-dl-replay-of``.

Every value is text or bytes — nothing a codec could overflow (a message whose
``cv-ts`` was ``99999999999999999999999`` once jammed its queue that way).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import H_REPLAY_OF, LETTER_FORMS, DeadLetter, Message

VERSION = "2"
FIELDS = (
    "cv-dl-v",
    "cv-dl-app",
    "cv-dl-handler",
    "cv-dl-error-type",
    "cv-dl-error",
    "cv-dl-attempts",
    "cv-dl-at",
    "cv-dl-token",
    "cv-dl-form",
    "cv-dl-replay-of",
)
META_COUNT = len(FIELDS)
META_COUNT_V1 = META_COUNT - 1
PREFIX = "cv-dl-"


def meta_pairs(letter: DeadLetter, app: str) -> list[tuple[str, str]]:
    """The letter's own fields, in :data:`FIELDS` order."""
    token = letter.message.token
    return list(zip(FIELDS, (
        VERSION,
        app,
        letter.handler,
        letter.error_type,
        letter.error,
        str(letter.attempts),
        str(letter.failed_at_ms),
        str(token) if token is not None else "",
        letter.form,
        letter.message.headers.get(H_REPLAY_OF, ""),
    ), strict=True))


def meta_count(version: bytes | str) -> int:
    """How many leading pairs are the letter's, by its ``cv-dl-v``."""
    return META_COUNT_V1 if version in (b"1", "1") else META_COUNT


def is_letter(names: list[bytes] | list[str]) -> bool:
    """Whether a stored entry / record starts with this layout's fields."""
    if len(names) < META_COUNT:
        return False
    first = names[0]
    return (first.decode("utf-8", "replace") if isinstance(first, bytes) else first) == FIELDS[0]


def letter_from_meta(values: list[bytes], message: Message) -> DeadLetter:
    """A :class:`DeadLetter` from the :data:`META_COUNT` values read back, in order."""
    text = [v.decode("utf-8", "replace") for v in values]
    _, _app, handler, error_type, error, attempts, at, token, form = text[:META_COUNT_V1]
    if token:  # where it was in its queue, as stored (the decoder's is a reconstruction)
        with contextlib.suppress(ValueError):
            message = message.with_token(SequenceToken.parse(token))
    return DeadLetter(
        message=message,
        handler=handler,
        error_type=error_type,
        error=error,
        attempts=int(attempts) if attempts.isascii() and attempts.isdigit() else 0,
        failed_at_ms=int(at) if at.isascii() and at.isdigit() else 0,
        form=form if form in LETTER_FORMS else "full",
    )


def app_of(values: list[bytes]) -> str:
    """The app a stored letter belongs to (its ``cv-dl-app``)."""
    return values[1].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Replay:
    """One letter to replay: its id, and the message to append to ``queue`` for it."""

    letter_id: str
    queue: int
    message: Message


@dataclass(frozen=True, slots=True)
class StoredLetter:
    """A dead letter as the store holds it, under the id operators use.

    ``id`` is the store's own: a Redis entry id of the app's dead-letter stream
    (``1700000000000-0``), ``PARTITION:OFFSET`` of the Kafka dead-letter topic, a counter
    on the memory adapter.
    """

    id: str
    letter: DeadLetter

    @property
    def replay_of(self) -> str:
        """The letter this one's message was replayed from; "" if it never was."""
        return self.letter.message.headers.get(H_REPLAY_OF, "")
