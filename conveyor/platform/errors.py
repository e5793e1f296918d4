"""One error tree for the whole platform.

Everything Conveyor raises on purpose derives from :class:`ConveyorError`; the
exceptions of redis-py, aiokafka and friends are translated into these at the
adapter boundary, so callers never need to import a driver to catch a failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from conveyor.platform.ids import SequenceToken

_T = TypeVar("_T")


class ConveyorError(Exception):
    """Root of every error Conveyor raises on purpose."""


def error_text(exc: BaseException) -> str:
    """``exc`` in a log line or a reason: ``Type: message``, or the type alone when its
    message is empty (``TimeoutError()``, as ``asyncio.timeout`` raises it), which read
    ``lease renewal failed: TimeoutError: `` as if the reason had been cut off."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ConfigError(ConveyorError):
    """A configuration file, environment override or CLI flag is invalid.

    The message names the offending field (``$.worker.slots``) and the source.
    """


class AppAliveError(ConveyorError):
    """An operation that needs an app's daemons stopped found signs of one running."""


class InvalidArgumentError(ConveyorError, ValueError):
    """A value handed to Conveyor is out of range or malformed: a pool of no workers, a
    negative PID gain, a token that does not parse. The message names the value and what
    was expected.

    Also a :class:`ValueError`, which is what these checks raised before Conveyor had
    one error tree and what Python code expects of a bad value: ``except ValueError``
    keeps working.
    """


class ForwardRewindError(InvalidArgumentError):
    """A rewind target ahead of an app's position: it would skip messages never handled.
    A bad value of the ``to`` argument, unless ``allow_forward``."""


class TokenRangeError(InvalidArgumentError):
    """A sequence token beyond the positions a backend has (a Kafka offset above
    2**63-1): a bad value of a rewind's ``to``."""


class UnknownGroupError(InvalidArgumentError):
    """An app named where it has no consumer group (a typo, or an app that never ran): a
    name that names nothing there."""


class SlotSupplierError(ConveyorError, TypeError):
    """A slot supplier broke its contract: a hook returned something that is not a
    permit of its own (``return self.new_permit()``). User-written suppliers run inside a
    guard that logs it, counts it and treats it as "no slot"."""


class HandlerDeclarationError(ConveyorError):
    """A handler was declared with a signature or options Conveyor cannot honour."""


class BrokerError(ConveyorError):
    """A queue backend failed."""


class BrokerConnectionError(BrokerError):
    """The backend could not be reached; the operation may succeed if retried."""


class StoreUnfitError(BrokerError):
    """Where the backend keeps messages, dead letters or its balancer's state holds
    something else, or is set to delete them (a Redis key of another type, say): no
    retry or shorter write helps until an operator fixes it. The message names the
    store, what is there instead, what belongs there and what to do."""


class PublishUncertain(BrokerConnectionError):
    """A publish failed in a way that leaves unknown whether its messages were written.

    The connection broke after the messages were sent and the retries (which cannot write
    a message twice) ran out before the broker answered. Some, all or none of them may be
    in the queue: ``message_ids`` are their ``cv-id`` values, to look up or to deduplicate
    by in the handler. Publishing them again as new messages may write them twice. Also a
    :class:`BrokerConnectionError`, so code that retries on outages keeps catching it.
    """

    def __init__(self, message: str, message_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message_ids = message_ids


class PublishNotReplicated(PublishUncertain):
    """The primary wrote the messages, but fewer replicas than ``[redis] min_replicas``
    confirmed them within ``replica_timeout_ms``: a failover before they catch up could
    lose them. ``message_ids`` as for :class:`PublishUncertain`; publishing them again
    as new messages may write them twice."""


class PartialPublishError(BrokerError):
    """A ``publish_batch`` stored some of its messages and not others.

    Every message of the batch is in exactly one of three places, by its ``cv-id``:

    - ``published``: stored, with its position in the queue (id -> token);
    - ``failed``: surely not stored, with why (id -> the error of its queue, or of its
      Redis chunk / Kafka record batch) — publishing these again doubles nothing;
    - ``uncertain``: unknown, as for :class:`PublishUncertain` (the connection broke
      after they were sent): look them up, or let handlers deduplicate by id.

    ``ids`` lists every message's id in the order of the batch, so
    :meth:`not_published` can hand back the items to publish again. What one queue
    holds is stored in order, so retrying the failed items in their order keeps each
    stream's order among them.
    """

    def __init__(self, message: str, ids: Sequence[str],
                 published: Mapping[str, SequenceToken],
                 failed: Mapping[str, BaseException],
                 uncertain: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ids = tuple(ids)
        self.published = dict(published)
        self.failed = dict(failed)
        self.uncertain = tuple(uncertain)

    def not_published(self, items: Sequence[_T]) -> list[_T]:
        """The items of the failed batch (as given to ``publish_batch``, same order)
        whose messages are surely not stored: the ones to publish again."""
        if len(items) != len(self.ids):
            raise InvalidArgumentError(
                f"not_published takes the {len(self.ids)} items of the failed batch, "
                f"got {len(items)}")
        failed = self.failed
        return [item for item, ident in zip(items, self.ids, strict=True) if ident in failed]


class MessageTooLargeError(InvalidArgumentError):
    """A message is larger than a limit set in the config (``[queues] max_body_bytes``,
    ``[kafka] max_request_size``); it was refused before anything was sent. The message
    names the size, the limit and the setting."""


class BodyEncodeError(InvalidArgumentError, TypeError):
    """A message's body cannot be sent as its content type: an object the encoder does
    not know (``object()``, a set as a dict key), a float JSON cannot carry (NaN,
    infinity: JSON would carry it as ``null``), two keys of one object that JSON writes
    alike (``{1: "a", "1": "b"}``: JSON's keys are text), a structure nested too deeply,
    text with a lone surrogate. Refused before anything was sent; the message names the
    stream and why.

    Also a :class:`TypeError` and a :class:`ValueError`: what encoding a body raised
    before (a ``RecursionError`` aside), so ``except TypeError`` keeps working."""


class QueueOwnedError(BrokerError):
    """A queue is still owned by a running receiver of the app: stop its workers first."""


class LeaseLostError(BrokerError):
    """This daemon no longer owns the queue it tried to act on (fencing)."""


class DecodeError(ConveyorError):
    """A message body or envelope could not be decoded; it goes to the dead-letter queue."""


class DeliveryLimit(ConveyorError):
    """A message was delivered more than its handler's ``max_deliveries`` times without
    finishing (its workers crashed or stalled while holding it): it is not run again but
    dead-lettered with this error (reason ``DeliveryLimit``)."""


class ShutdownError(ConveyorError):
    """An operation was attempted on a component that is shutting down."""
