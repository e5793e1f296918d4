"""Whether the Redis the console reads refuses connections, and broker work cut short when
it does.

The Redis adapter retries a refused connection as an outage, for ``[redis] retry_max_s``
a call (10 s by default): right for a daemon, which outlives a restart, but a console
poll, or a request an operator waits on, would answer only after the retries. Every piece
of the console's broker work — a poll, the dead-letter list, a letter, a write action —
runs through :func:`unless_refused`, which probes the Redis while the work is not done
and, once every address of it refuses a TCP connection, stops the work and raises
:class:`Refused` naming them.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.config import Config
from conveyor.platform.config.checks import SENTINEL_PORT
from conveyor.platform.errors import BrokerConnectionError
from conveyor.platform.tasks import retrieve

T = TypeVar("T")

PROBE_EVERY_S = 0.5
"""Work not done this long after it started, or after the last probe, has the Redis it
reads probed (:func:`refused`). A poll of a broker that answers takes a few tens of
milliseconds; longer work (a replay of thousands of letters) is probed again every
half second, so that a broker gone midway is noticed as promptly."""
PROBE_TIMEOUT_S = 1.0
"""Longest one probe of one host waits: an address silent this long is no refusal."""
STOP_WITHIN_S = 2.0
"""Longest the console waits for refused work to end once cancelled (:func:`_stop`): a
write action's answer then says what was done, not what may still happen."""
RECANCEL_EVERY_S = 0.5
"""How often the cancel is repeated while refused work has not ended: Python 3.11's
``asyncio.wait_for``, which redis-py calls on every command write, returns the result
instead of raising when a cancel arrives as the write completes, and the work goes on.
Not more often: a repeated cancel also cuts short the adapter's close in the work's
``finally``."""
REDIS_PORT = 6379
"""Where ``[redis] url`` points when it names no port."""


class Refused(BrokerConnectionError):
    """Every address of the Redis the work reads refused a connection (its port closed)."""

    def __init__(self, where: str, *, stopped: bool) -> None:
        super().__init__(f"redis at {where} refused the connection")
        self.where = where
        self.stopped = stopped
        """Whether the work ended before this was raised (else it may go on in the
        background, within the adapter's retries, should the broker come back)."""


async def unless_refused(config: Config, work: Coroutine[Any, Any, T],
                         nodes: Iterable[str] = ()) -> T:
    """``work``'s result; or, once every address of the Redis it reads (:func:`refused`,
    with ``nodes``) refuses a connection while it is not done, :class:`Refused`, the work
    stopped first (:func:`_stop`). Work that ended with a result meanwhile returns it.

    Cancelled (the poll's bound, the console stopping), the work is cancelled and not
    waited for."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=PROBE_EVERY_S)
            if done:
                return task.result()
            where = await refused(config, nodes)
            if where is not None and not task.done():
                stopped = await _stop(task)
                if stopped and not task.cancelled() and task.exception() is None:
                    return task.result()  # it finished before the cancel reached it
                raise Refused(where, stopped=stopped)
    except BaseException:
        task.cancel()
        task.add_done_callback(retrieve)
        raise


async def _stop(task: asyncio.Future[Any]) -> bool:
    """Cancel ``task``, again every :data:`RECANCEL_EVERY_S` while it runs (a cancel may
    be lost), for at most :data:`STOP_WITHIN_S`; whether it ended."""
    loop = asyncio.get_running_loop()
    until = loop.time() + STOP_WITHIN_S
    while not task.done() and loop.time() < until:
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_EVERY_S)
    return task.done()


def cluster_nodes(adapter: QueueAdapter) -> list[str]:
    """``HOST:PORT`` of each node a Redis Cluster client of ``adapter`` knows: the URL's,
    and every node it found reading the slots (redis-py keeps them as its start-up nodes
    for the next reading); none for any other adapter or mode. Read from the client's
    attributes, as no adapter method tells: a probe of the URL's node alone called a
    cluster refusing whose other nodes served on."""
    manager = getattr(getattr(adapter, "redis", None), "nodes_manager", None)
    known = getattr(manager, "startup_nodes", None)
    return [name for name in known if isinstance(name, str)] if isinstance(known, dict) else []


async def refused(config: Config, nodes: Iterable[str] = ()) -> str | None:
    """The Redis ``config`` reads (``[redis] url`` and, in cluster mode, ``nodes``; with
    ``mode = "sentinel"`` its sentinels), as ``HOST:PORT, ...``, when every one of their
    addresses refuses a TCP connection; None when one accepts, or gives no answer within
    :data:`PROBE_TIMEOUT_S`, or when ``config`` uses no Redis (Kafka's client says at once
    that no broker is reachable)."""
    if config.queues.adapter != "redis" and config.balancer.membership != "redis":
        return None
    cfg = config.redis
    if cfg.mode == "sentinel":
        servers = [urlsplit(f"//{item}") for item in cfg.sentinels]
        default = SENTINEL_PORT
    else:
        servers, default = [urlsplit(cfg.url)], REDIS_PORT
        if servers[0].scheme not in ("redis", "rediss"):  # a unix socket: no port to probe
            return None
        if cfg.mode == "cluster":
            servers += [urlsplit(f"//{node}") for node in nodes]
    try:
        named = list(dict.fromkeys((s.hostname or "localhost", s.port or default)
                                   for s in servers))
    except ValueError:  # a port out of range: the adapter reports the config's mistake
        return None
    for host, port in named:
        if not await _refuses(host, port):
            return None
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in named)


async def _refuses(host: str, port: int) -> bool:
    """Whether every address ``host`` resolves to refuses a connection on ``port``."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            for *_, address in infos:
                try:
                    _, writer = await asyncio.open_connection(str(address[0]), int(address[1]))
                except ConnectionRefusedError:
                    continue
                writer.close()
                return False
    except (OSError, TimeoutError):  # unresolved, unreachable, silent: not a refusal
        return False
    return bool(infos)
