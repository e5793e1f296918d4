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

When skipped messages are most of what the daemon took (:data:`MOSTLY_SKIPPED` of at least
:data:`SKIPS_BEFORE_CHECK` in a :data:`SKIP_WINDOW_S` window), the app is almost surely
sharing its queues with unrelated apps' traffic: one warning a window says so and names
the fix (its own ``[redis] prefix`` or ``[kafka] topic``; docs/apps-on-one-broker.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

from conveyor.platform.delivery.chain import DeliveryStats
from conveyor.platform.delivery.dead_letter import PutLetter
from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.ids import NAME_SHOWN_MAX, shown_name
from conveyor.platform.message import DeadLetter, Message, Undecodable
from conveyor.platform.throttled_log import ThrottledLog

log = logging.getLogger("conveyor.agent")

UNROUTABLE_POLICIES = ("skip", "dead-letter")

SKIP_WINDOW_S = 60.0
SKIPS_BEFORE_CHECK = 100
"""Skips between two looks at the share skipped (the hot path only counts)."""
MOSTLY_SKIPPED = 0.5


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
        self._skips = _SkipShare(stats, app)

    def take(self, msg: Message) -> Awaitable[None] | None:
        """What to await before ``msg`` may be acknowledged; None: acknowledge it now."""
        if isinstance(msg, Undecodable):
            return self._put(DeadLetter.of(msg, "", msg.reason, 0, "Undecodable"))
        namespace = msg.stream.namespace
        if self._dead_letter_unroutable:
            return self._put(DeadLetter.of(
                msg, "", f"no handler of app {self._app!r} subscribes to namespace "
                f"{shown_name(namespace, quoted=True)}", 0, "Unroutable",
            ))
        self._stats.skipped += 1
        self._skips.note(namespace)
        self._notes.log(  # keyed by a long namespace's start: the key is kept a while
            logging.WARNING, namespace[:NAME_SHOWN_MAX],
            "app %r skips messages of namespace %s: none of its handlers subscribes (another "
            "app sharing the queues under its own name may; one running under this app's "
            "name shares its consumer group and never sees them: give each app its own "
            "name. [dead_letters] unroutable = \"dead-letter\" keeps them as dead letters "
            "instead)", self._app, shown_name(namespace, quoted=True),
        )
        return None


class _SkipShare:
    """Warns, once a window, when skipped messages are most of what the daemon took."""

    def __init__(self, stats: DeliveryStats, app: str) -> None:
        self._stats = stats
        self._app = app
        self._namespaces: set[str] = set()
        self._quiet_until = 0.0
        self._start(time.monotonic())

    def _start(self, now: float) -> None:
        stats = self._stats
        self._window_at = now
        self._skipped_at_start = stats.skipped
        self._taken_at_start = stats.handled + stats.dead_lettered
        self._check_at = stats.skipped + SKIPS_BEFORE_CHECK
        self._namespaces.clear()

    def note(self, namespace: str) -> None:
        if len(self._namespaces) < 5:
            self._namespaces.add(shown_name(namespace))
        if self._stats.skipped < self._check_at:
            return
        now = time.monotonic()
        stats = self._stats
        skipped = stats.skipped - self._skipped_at_start
        taken = skipped + stats.handled + stats.dead_lettered - self._taken_at_start
        self._check_at = stats.skipped + SKIPS_BEFORE_CHECK
        if skipped > MOSTLY_SKIPPED * taken and now >= self._quiet_until:
            self._quiet_until = now + SKIP_WINDOW_S
            log.warning(
                "app %r skipped %d of the %d messages it took in the last %.1f s: no handler "
                "of it takes their namespaces (%s), so it is reading other apps' traffic. "
                "Give unrelated apps their own [redis] prefix or [kafka] topic "
                "(docs/apps-on-one-broker.md); for a new app, [queues] new_group_start = "
                "\"latest\" skips what was published before it", self._app, skipped, taken,
                now - self._window_at, ", ".join(sorted(self._namespaces)),
            )
        if now - self._window_at >= SKIP_WINDOW_S:
            self._start(now)
