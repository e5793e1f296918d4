"""``[redis] url``: checked when a config loads (:func:`check_url`), shown with its
password masked (:func:`redact_url`). Plain ``urllib``: no Redis client is imported to
load a config; the adapter (``conveyor.adapters.redis.urls``) adds redis-py's own parse
before it connects.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, unquote, unquote_plus, urlsplit, urlunsplit

from conveyor.platform.config.hosts import check_host
from conveyor.platform.errors import ConfigError


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log or print).

    Both places redis-py reads a password from are covered: the user-info part
    (``redis://user:pw@host``, even when a ``/``, ``?`` or ``#`` in ``pw`` cut it short)
    and the ``password`` query parameter (``?password=pw``).
    """
    if _userinfo_cut_short(url):
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
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


def _userinfo_cut_short(url: str) -> bool:
    """Whether a ``/``, ``?`` or ``#`` in the password (not percent-encoded) ended the
    host part before its ``@``: urllib then finds no password, and all the user-info
    must be masked. An ``@`` in an option's value (``?client_name=a@b``) is no sign."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "@" in url
    if "://" not in url or "@" in parts.netloc:
        return False
    return ("@" in parts.path or "@" in parts.fragment
            or any("@" in field.partition("=")[0] for field in parts.query.split("&")))


URL_OPTIONS = ("db", "username", "password", "client_name", "health_check_interval",
               "socket_keepalive")
"""Query parameters a Redis URL may carry; the others redis-py knows are set in ``[redis]``
(below) or by Conveyor itself, and anything else would fail only when connecting."""
MAX_DB = 2**31 - 1
"""The highest database number SELECT takes (a 32-bit int): one past it could never
work, whatever the server's ``databases``, and the server's refusal came only once
running, as "value is not an integer or out of range" (exit 1)."""
_BOOLEANS = frozenset({"true", "false", "1", "0", "yes", "no", "t", "f", "y", "n"})
"""What ``socket_keepalive`` may say: the words redis-py reads as false, and their opposites
(it reads anything else as true)."""
_CLIENT_NAME = re.compile(r"[!-~]*")
"""What Redis takes as a client name: no spaces, newlines or other special characters."""
_URL_FIELDS = {
    "socket_timeout": "socket_timeout_s", "timeout": "socket_timeout_s",
    "socket_connect_timeout": "connect_timeout_s", "retry_on_timeout": "retry_max_s",
    "ssl_check_hostname": "tls_verify", "ssl_cert_reqs": "tls_verify",
    "ssl_ca_certs": "tls_ca_file", "ssl_certfile": "tls_cert_file",
    "ssl_keyfile": "tls_key_file",
}


def check_url(url: str, *, cluster: bool = False, field: str = "$.redis.url") -> None:
    """Refuse a URL redis-py would misread or reject only when connecting (ConfigError
    naming ``field``): run when a config loads, and by the adapter before it connects.

    A cluster has database 0 only: another number is refused with ``cluster``.

    Errors show the URL through :func:`redact_url` and name options, never their values.
    """
    shown = redact_url(url)
    if _userinfo_cut_short(url):
        raise ConfigError(
            f"{field}: a '/', '?' or '#' in the password ends the host part before its "
            f"'@'; write them percent-encoded (%2F, %3F, %23), got {shown}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError:
        raise ConfigError(
            f"{field}: not a valid URL ({shown}); expected "
            "redis[s]://[USER:PASSWORD@]HOST[:PORT][/DB][?OPTION=VALUE...]"
        ) from None
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"{field}: expected redis:// or rediss://, got {shown}")
    check_host(parts.hostname or "", field)
    # redis-py drops both without a word: port 0 for 6379, and all after a '#'.
    if parts.port == 0:
        raise ConfigError(f"{field}: port 0 is no server's port (redis-py would connect "
                          f"to 6379 instead), got {shown}")
    if "#" in url:
        raise ConfigError(f"{field}: a '#' ends a URL, and redis-py drops what follows "
                          f"it; remove it, got {shown}")
    db = unquote(parts.path).strip("/")
    if db and not (db.isascii() and db.isdigit()):
        raise ConfigError(f"{field}: the path is a database number, got {shown}")
    options = parse_qsl(parts.query, keep_blank_values=True)
    _refuse_twice(field, shown, db, parts, [option for option, _ in options])
    query_db = dict(options).get("db", "")
    if query_db and not (query_db.isascii() and query_db.isdigit()):
        raise ConfigError(f"{field}: the db option is a database number, got {shown}")
    for number in (db, query_db):
        if number and int(number) > MAX_DB:
            raise ConfigError(
                f"{field}: database {int(number)} is more than any Redis server numbers "
                f"(SELECT takes at most {MAX_DB}; a server has `databases` of them, 16 by "
                f"default, numbered from 0), got {shown}")
    if cluster and any(d.strip("0") for d in (db, query_db)):
        raise ConfigError(
            f"{field}: a Redis Cluster has database 0 only ($.redis.mode is "
            f"\"cluster\"), got {shown}"
        )
    for option, value in options:
        if option in _URL_FIELDS:
            raise ConfigError(
                f"{field}: set {option!r} as [redis] {_URL_FIELDS[option]}, "
                f"not in the URL ({shown})"
            )
        if option not in URL_OPTIONS:
            raise ConfigError(
                f"{field}: unknown option {option!r} in {shown} "
                f"(accepted: {', '.join(URL_OPTIONS)})"
            )
        # redis-py hands these on unchecked: a negative interval health-checks every
        # command (and breaks the connection's handshake), and the server refuses such
        # a name — each found only once connected, as a Redis error (exit 1).
        if option == "health_check_interval" and not (value.isascii()
                                                       and value.isdigit()):
            raise ConfigError(
                f"{field}: health_check_interval is whole seconds from 0, got {shown}")
        if option == "socket_keepalive" and value.lower() not in _BOOLEANS:
            # redis-py takes any other text as true: "off" would turn keepalive on.
            raise ConfigError(
                f"{field}: socket_keepalive is true or false (or 1/0, yes/no), got {shown}")
        if option == "client_name" and not _CLIENT_NAME.fullmatch(value):
            raise ConfigError(
                f"{field}: client_name is printable ASCII without spaces (Redis' rule for "
                f"CLIENT SETNAME), got {shown}")


def _refuse_twice(field: str, shown: str, path_db: str, parts: SplitResult,
                  options: list[str]) -> None:
    """Refuse a setting the URL gives twice. redis-py keeps one without a word: the
    first of a repeated option, ``?db=`` over the path's database, the user-info's
    username and password over ``?username=`` and ``?password=``."""
    repeated = sorted({option for option in options if options.count(option) > 1})
    if repeated:
        raise ConfigError(f"{field}: option {repeated[0]!r} is given more than once, "
                          f"give it once ({shown})")
    if path_db and "db" in options:
        raise ConfigError(f"{field}: the database is given twice, as the path "
                          f"(/{path_db}) and as ?db=; give it once ({shown})")
    for option, given in (("username", parts.username), ("password", parts.password)):
        if given and option in options:
            raise ConfigError(f"{field}: the {option} is given twice, before the host "
                              f"and as ?{option}=; give it once ({shown})")
