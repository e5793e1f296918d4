"""Redis' eviction policy: what a full server deletes, read before it is trusted with
messages (``[redis] allow_eviction``; docs/redis.md, "Eviction policy")."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters.redis.errors import Caller, wrong_database
from conveyor.adapters.redis.server_settings import config_value, per_server, summary, text
from conveyor.platform.config import RedisConfig
from conveyor.platform.errors import ConfigError

log = logging.getLogger("conveyor.redis")

SAFE_EVICTION = "noeviction"
"""The one ``maxmemory-policy`` under which Redis never deletes a key to make room (it
refuses writes instead). Every other policy may evict a queue's stream — confirmed
messages lost — or, the ``volatile-*`` ones too, a key with a TTL: a lease (two daemons
then run the same messages) or a publish's marker (a retried publish is written twice)."""


async def _eviction_policy(client: aioredis.Redis) -> str | None:
    """One server's ``maxmemory-policy``: ``CONFIG GET``, or ``INFO memory`` where
    ``CONFIG`` is refused (managed services rename or forbid it); None if neither says."""
    try:
        value = await config_value(client, "maxmemory-policy")
    except rex.ResponseError as exc:  # unknown command, NOPERM: ask INFO instead
        if wrong_database(exc):  # not a refusal of CONFIG: every call will fail so
            raise
        value = None
    if value is None:
        try:
            info: dict[str, Any] = await client.info("memory")
        except rex.ResponseError:  # INFO refused too: the caller warns
            return None
        value = text(info.get("maxmemory_policy"))
    return value


def check_eviction(policies: dict[str, str | None], allow: bool) -> None:
    """Refuse (ConfigError naming ``$.redis.allow_eviction``) a server whose policy may
    evict keys, unless ``allow``; then, or when a policy could not be read, warn."""
    risky = {s: p for s, p in policies.items() if p is not None and p != SAFE_EVICTION}
    unread = sorted(s for s, p in policies.items() if p is None)
    if unread:
        log.warning("could not read maxmemory-policy on %s (CONFIG GET and INFO refused); "
                    "it must be %r or a full server evicts messages and leases",
                    ", ".join(unread), SAFE_EVICTION)
    if not risky:
        return
    where = ", ".join(f"{policy!r} on {server}" for server, policy in risky.items())
    if allow:
        log.warning("redis maxmemory-policy is %s, accepted by [redis] allow_eviction = "
                    "true: once the server is full it may delete queued messages (lost) "
                    "and leases (messages run twice)", where)
        return
    raise ConfigError(
        f"$.redis.allow_eviction: the Redis maxmemory-policy is {where}: once the server "
        "is full it may delete queue streams (confirmed messages lost) and keys with a "
        "TTL — leases (messages run twice) and publish markers (retries written twice). "
        f"Set maxmemory-policy {SAFE_EVICTION} (CONFIG SET maxmemory-policy "
        f"{SAFE_EVICTION}, and in redis.conf), or accept the risk with [redis] "
        "allow_eviction = true"
    )


RECHECK_REPEAT = 10
"""While a policy that may evict lasts, :meth:`EvictionGuard.recheck` logs it again
every this many looks (10 minutes at the daemon's 60 s)."""


UNREAD_AGAIN_S = 5.0
"""While a cluster's primary does not answer, how often a publish asks its policy again
(:meth:`EvictionGuard.check`)."""


class EvictionGuard:
    """A server's eviction policy, checked (:func:`check_eviction`) before it is trusted
    with messages: when a daemon starts and before a client's first publish.

    ``checked`` stays False while the policy is refused, so every publish asks again: a
    server set to ``noeviction`` meanwhile is accepted on the next one. So it does while
    a cluster's primary does not answer (the others' policies read and accepted): a
    publish to the primaries that serve their slots goes on, and the missing one is
    asked again by the first publish :data:`UNREAD_AGAIN_S` after the last ask (each
    ask re-reads the cluster's slots and every primary: not one a publish).
    """

    def __init__(self, cfg: RedisConfig, caller: Caller) -> None:
        self._allow = bool(cfg.allow_eviction)
        self._caller = caller
        self.checked = False
        self._said: dict[str, str] = {}
        """The risky policies :meth:`recheck` last logged (empty: none)."""
        self._looks = 0
        self._unread: set[str] = set()
        """The primaries whose policy the last check could not read (they did not answer),
        the others' accepted."""
        self._ask_again_at = 0.0
        """While :attr:`_unread` holds some, when (``time.monotonic()``) to ask again."""

    async def policies(self, *, retry: bool = True,
                       unreachable: dict[str, str] | None = None) -> dict[str, str | None]:
        return await per_server(self._caller, "reading the eviction policy",
                                _eviction_policy, retry=retry, unreachable=unreachable)

    async def check(self, *, retry: bool) -> None:
        """Refuse or accept the policy (one attempt unless ``retry``)."""
        now = time.monotonic()
        if self._unread and now < self._ask_again_at:
            return  # asked lately (the class's docstring)
        self._ask_again_at = now + UNREAD_AGAIN_S
        unread, self._unread = self._unread, set()
        unreachable: dict[str, str] = {}
        check_eviction(await self.policies(retry=retry, unreachable=unreachable),
                       self._allow)
        if unreachable and set(unreachable) != unread:  # once, not every ask
            log.warning("could not read maxmemory-policy on %s: asked again every %gs "
                        "before a publish", "; ".join(f"{s} ({why})"
                                                      for s, why in unreachable.items()),
                        UNREAD_AGAIN_S)
        self._unread = set(unreachable)
        self.checked = not unreachable

    async def recheck(self) -> None:
        """Log an error when the policy now may evict and ``allow_eviction`` is off
        (changed since the start, which refused it): once per change of what it says,
        and again every :data:`RECHECK_REPEAT` looks while it lasts; one line when it
        is safe again."""
        policies = await self.policies(retry=False)
        risky = {s: p for s, p in policies.items() if p is not None and p != SAFE_EVICTION}
        said = self._said
        if risky and not self._allow:
            self._looks = 0 if risky != said else self._looks + 1
            if risky != said or self._looks % RECHECK_REPEAT == 0:
                where = ", ".join(f"{policy!r} on {server}" for server, policy in risky.items())
                log.error("redis maxmemory-policy is now %s, changed while this worker runs: "
                          "once the server is full it may delete queued messages (lost) and "
                          "leases (messages run twice). Set it back: CONFIG SET "
                          "maxmemory-policy %s ($.redis.allow_eviction)", where, SAFE_EVICTION)
            self._said = risky
        elif said and not risky:
            log.warning("redis maxmemory-policy is %r again", SAFE_EVICTION)
            self._said = {}

    async def summary(self) -> str:
        return summary({s: p or "unknown" for s, p in (await self.policies()).items()})
