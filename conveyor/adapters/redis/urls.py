"""Where ``[redis]`` points: URL checks, redaction, the sentinels' addresses.

The URL's checks and redaction live with the config (``conveyor.platform.config.
redis_url``), which runs them when a config loads; they are re-exported here.

Nothing here prints a password: URLs are logged through :func:`redact_url` only.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio.connection as rconn

from conveyor.platform.config import RedisConfig
from conveyor.platform.config.checks import SENTINEL_PORT
from conveyor.platform.config.redis_url import URL_OPTIONS, redact_url
from conveyor.platform.config.redis_url import check_url as check_config_url
from conveyor.platform.errors import ConfigError

__all__ = ["URL_OPTIONS", "check_url", "redact_url", "sentinel_addresses", "server_name"]

def check_url(url: str, *, cluster: bool = False) -> None:
    """The config's check (:func:`conveyor.platform.config.redis_url.check_url`), then
    redis-py's own parse: what a config holds that skipped loading (a Struct built or
    replaced in code) fails here, before a connection, as it would have at load."""
    check_config_url(url, cluster=cluster)
    try:
        rconn.parse_url(url)
    except ValueError as exc:  # "Invalid value for 'db' in connection URL." (no value)
        raise ConfigError(f"$.redis.url: {exc} ({redact_url(url)})") from None


def server_name(cfg: RedisConfig) -> str:
    """Where ``[redis]`` points, safe to log: the URL (redacted), or with ``mode =
    "sentinel"`` the service and the sentinels asked for it."""
    if cfg.mode == "sentinel":
        return f"{cfg.sentinel_service} (sentinels {','.join(cfg.sentinels)})"
    return redact_url(cfg.url)


def sentinel_addresses(sentinels: Sequence[str]) -> list[tuple[str, int]]:
    """``[redis] sentinels`` (``HOST[:PORT]``, ``[IPV6][:PORT]``; checked when the config
    loads) as the ``(host, port)`` pairs redis-py takes."""
    addresses = []
    for item in sentinels:
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        addresses.append((host, int(port or SENTINEL_PORT)))
    return addresses
