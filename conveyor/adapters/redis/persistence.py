"""Redis' persistence: what a server keeps across a restart, read when a daemon starts
and by ``conveyor status`` (docs/redis.md, "Persistence").

Never refused: a deployment may use Redis as a cache of work it can re-create, and
choose to keep nothing. Reported instead, by how much a restart can lose:

* ``none`` (``save ""`` and ``appendonly no``): a restart, even a clean one, comes back
  empty — every queued and pending message lost. A warning when a daemon starts, and in
  ``conveyor status``.
* ``unknown`` (``CONFIG`` refused, as managed services do, and ``INFO persistence`` shows
  no AOF): ``INFO`` gives no RDB save schedule, so nothing tells ``rdb`` from ``none``.
  Warned about as ``none`` is, saying it could not be read.
* ``rdb`` (a save schedule, ``appendonly no``): a crash loses what was written since the
  last snapshot — with Redis' default schedule, up to the last hour of acknowledged
  publishes on a quiet server, a minute on a busy one; a clean shutdown saves first.
  A weaker note: an info line when a daemon starts, and the value in ``conveyor
  status``, with no warning. It is Redis' own default, a choice many deployments make
  knowingly, and a warning at every start for it would teach operators to ignore the
  one that matters (``none``).
* ``aof`` (``appendonly yes``): nothing more said. ``appendfsync everysec``, Redis'
  default, can still lose about a second of writes on a crash of the machine.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters.redis.errors import Caller, wrong_database
from conveyor.adapters.redis.server_settings import config_value, per_server, summary

log = logging.getLogger("conveyor.redis")

AOF, RDB, NONE, UNKNOWN = "aof", "rdb", "none", "unknown"
"""What a server keeps across a restart (the module's docstring says what each costs)."""

LOSES_EVERYTHING = (NONE, UNKNOWN)
"""The readings warned about: a restart may come back with no message at all."""


async def _persistence(client: aioredis.Redis) -> str:
    """One server's persistence: ``CONFIG GET appendonly`` and ``save``, or where
    ``CONFIG`` is refused, ``aof_enabled`` from ``INFO persistence``."""
    try:
        appendonly = await config_value(client, "appendonly")
        save = await config_value(client, "save")
    except rex.ResponseError as exc:  # unknown command, NOPERM: ask INFO instead
        if wrong_database(exc):  # not a refusal of CONFIG: every call will fail so
            raise
        pass
    else:
        if appendonly is not None and save is not None:
            if appendonly == "yes":
                return AOF
            return RDB if save.strip() else NONE
    try:
        info: dict[str, Any] = await client.info("persistence")
    except rex.ResponseError:  # INFO refused too
        return UNKNOWN
    # INFO tells AOF, not the save schedule: with AOF off, rdb and none look alike
    # (rdb_last_save_time and rdb_changes_since_last_save say when, not whether, next).
    return AOF if str(info.get("aof_enabled")) == "1" else UNKNOWN


_REPORTED: set[tuple[str, str]] = set()
"""(server, reading) pairs this process has logged: a process that starts daemon after
daemon on one server (``--reload``, a benchmark's repeats) says it once."""


def report_persistence(readings: dict[str, str]) -> None:
    """Log what a restart of these servers may lose: a warning naming the servers that
    keep nothing (or may: ``unknown``), an info line for RDB snapshots alone; one line
    for each kind, each server named once — and once a process for what it reads the
    same again."""
    readings = {s: r for s, r in readings.items() if (s, r) not in _REPORTED}
    _REPORTED.update(readings.items())

    def on(kind: str) -> str:
        return ", ".join(s for s, r in readings.items() if r == kind)

    if none := on(NONE):
        log.warning("redis at %s keeps no data across a restart (save \"\", appendonly "
                    "no): a restart loses every queued and pending message; set "
                    "appendonly yes to keep them (docs/redis.md, \"Persistence\")", none)
    if unknown := on(UNKNOWN):
        log.warning("could not read the persistence of redis at %s (CONFIG GET refused, "
                    "and INFO persistence shows no AOF and never the RDB save schedule): "
                    "unless it snapshots, a restart loses every queued and pending "
                    "message (docs/redis.md, \"Persistence\")", unknown)
    if rdb := on(RDB):
        log.info("redis at %s persists by RDB snapshots only: a crash loses what was "
                 "published since the last snapshot; appendonly yes keeps it", rdb)


class PersistenceReader:
    """A server's persistence read through the adapter's :class:`Caller`: one attempt
    when a daemon starts (it logs :func:`report_persistence`), retried for status."""

    def __init__(self, caller: Caller) -> None:
        self._caller = caller
        self._last: dict[str, str] = {}
        """Each server's reading when last read by :meth:`report` or :meth:`recheck`."""

    async def read(self, *, retry: bool = True) -> dict[str, str]:
        return await per_server(self._caller, "reading the persistence settings",
                                _persistence, retry=retry)

    async def report(self) -> None:
        readings = await self.read(retry=False)
        self._last.update(readings)
        report_persistence(readings)

    async def recheck(self) -> None:
        """Report a server whose reading changed since the last one (``CONFIG SET
        appendonly no`` and ``save ""`` while the daemon runs), or not read before (a
        primary new after a failover), as :meth:`report` does at start: one that keeps
        nothing is a warning again."""
        readings = await self.read(retry=False)
        changed = {s: r for s, r in readings.items() if self._last.get(s) != r}
        self._last.update(readings)
        _REPORTED.difference_update(changed.items())
        report_persistence(changed)

    async def summary(self) -> str:
        return summary(await self.read())
