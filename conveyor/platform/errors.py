"""One error tree for the whole platform.

Everything Conveyor raises on purpose derives from :class:`ConveyorError`; the
exceptions of redis-py, aiokafka and friends are translated into these at the
adapter boundary, so callers never need to import a driver to catch a failure.
"""

from __future__ import annotations


class ConveyorError(Exception):
    """Root of every error Conveyor raises on purpose."""


class ConfigError(ConveyorError):
    """A configuration file, environment override or CLI flag is invalid.

    The message names the offending field (``$.worker.slots``) and the source.
    """


class ForwardRewindError(ConfigError):
    """A rewind target ahead of an app's position: it would skip messages never handled."""


class UnknownGroupError(ConfigError):
    """An app named where it has no consumer group (a typo, or an app that never ran)."""


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
