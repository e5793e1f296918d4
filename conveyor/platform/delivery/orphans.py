"""Messages no handler of the app takes: undecodable entries and unroutable namespaces.

The agent asks :meth:`Orphans.take` for each; they never enter a handler's chain.

* An **undecodable** entry (a receiver could not read its metadata: see
  :class:`~conveyor.platform.message.Undecodable`) is always dead-lettered, with its raw
  bytes and the reason, then acknowledged — its neighbours flow on.
* An **unroutable** message (a namespace no handler of this app subscribes to) belongs,
  when several apps share the queues, to another app: each app is its own consumer
  group on the same queues. By default (``[dead_letters] unroutable = "skip"``) it is
  acknowledged for this app and counted (``skipped``); with ``"dead-letter"`` it is
  dead-lettered first. Either way it is logged at most once per namespace a minute.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from conveyor.platform.delivery.chain import DeliveryStats
from conveyor.platform.delivery.dead_letter import PutLetter
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.message import DeadLetter, Message, Undecodable
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.agent")

UNROUTABLE_POLICIES = ("skip", "dead-letter")


class Orphans:
    def __init__(self, put_letter: PutLetter, stats: DeliveryStats, app: str,
                 unroutable: str = "skip") -> None:
        if unroutable not in UNROUTABLE_POLICIES:
            raise InvalidArgumentError(
                f"unroutable must be one of {UNROUTABLE_POLICIES}, got {unroutable!r}"
            )
        self._put = put_letter
        self._stats = stats
        self._app = app
        self._dead_letter_unroutable = unroutable == "dead-letter"
        self._notes = ThrottledLog(log, interval_s=60.0)

    def take(self, msg: Message) -> Awaitable[None] | None:
        """What to await before ``msg`` may be acknowledged; None: acknowledge it now."""
        if isinstance(msg, Undecodable):
            return self._put(DeadLetter.of(msg, "", msg.reason, 0, "Undecodable"))
        namespace = msg.stream.namespace
        if self._dead_letter_unroutable:
            return self._put(DeadLetter.of(
                msg, "", f"no handler of app {self._app!r} subscribes to namespace "
                f"{namespace!r}", 0, "Unroutable",
            ))
        self._stats.skipped += 1
        self._notes.log(
            logging.WARNING, namespace,
            "app %r skips messages of namespace %r: none of its handlers subscribes (another "
            "app sharing the queues may; [dead_letters] unroutable = \"dead-letter\" keeps "
            "them as dead letters instead)", self._app, namespace,
        )
        return None
