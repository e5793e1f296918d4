"""Where ``[redis]`` points: URL checks, redaction, the sentinels' addresses.

Nothing here prints a password: URLs are logged through :func:`redact_url` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit, urlunsplit

import redis.asyncio.connection as rconn

from conveyor.platform.config import RedisConfig
from conveyor.platform.config.checks import SENTINEL_PORT
from conveyor.platform.errors import ConfigError


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log or print).

    Both places redis-py reads a password from are covered: the user-info part
    (``redis://user:pw@host``) and the ``password`` query parameter (``?password=pw``).
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            netloc = f"{parts.username or ''}:***@{host}"
    except ValueError:
        return "<unparseable redis url>"
    query = "&".join(
        f"{field.partition('=')[0]}=***"
        if unquote_plus(field.partition("=")[0]).lower() == "password" else field
        for field in parts.query.split("&")
    ) if parts.query else parts.query
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


URL_OPTIONS = ("db", "username", "password", "client_name", "health_check_interval",
               "socket_keepalive")
"""Query parameters a Redis URL may carry; the others redis-py knows are set in ``[redis]``
(below) or by Conveyor itself, and anything else would fail only when connecting."""
_URL_FIELDS = {
    "socket_timeout": "socket_timeout_s", "timeout": "socket_timeout_s",
    "socket_connect_timeout": "connect_timeout_s", "retry_on_timeout": "retry_max_s",
    "ssl_check_hostname": "tls_verify", "ssl_cert_reqs": "tls_verify",
    "ssl_ca_certs": "tls_ca_file", "ssl_certfile": "tls_cert_file",
    "ssl_keyfile": "tls_key_file",
}


def check_url(url: str, *, cluster: bool = False) -> None:
    """Refuse a URL redis-py would misread or reject only when connecting (ConfigError).

    A cluster has database 0 only: another number is refused with ``cluster``.

    Errors show the URL through :func:`redact_url` and name options, never their values.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError:
        raise ConfigError(
            f"$.redis.url: not a valid URL ({shown}); expected "
            "redis[s]://[USER:PASSWORD@]HOST[:PORT][/DB][?OPTION=VALUE...]"
        ) from None
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"$.redis.url: expected redis:// or rediss://, got {shown}")
    db = unquote(parts.path).strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"$.redis.url: the path is a database number, got {shown}")
    query_db = dict(parse_qsl(parts.query)).get("db", "")
    if cluster and any(d.strip("0") for d in (db, query_db)):
        raise ConfigError(
            f"$.redis.url: a Redis Cluster has database 0 only ($.redis.mode is "
            f"\"cluster\"), got {shown}"
        )
    for option, _ in parse_qsl(parts.query, keep_blank_values=True):
        if option in _URL_FIELDS:
            raise ConfigError(
                f"$.redis.url: set {option!r} as [redis] {_URL_FIELDS[option]}, "
                f"not in the URL ({shown})"
            )
        if option not in URL_OPTIONS:
            raise ConfigError(
                f"$.redis.url: unknown option {option!r} in {shown} "
                f"(accepted: {', '.join(URL_OPTIONS)})"
            )
    try:
        rconn.parse_url(url)
    except ValueError as exc:  # "Invalid value for 'db' in connection URL." (no value)
        raise ConfigError(f"$.redis.url: {exc} ({shown})") from None


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
