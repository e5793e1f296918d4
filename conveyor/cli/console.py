"""``conveyor console``: serve the web console (:mod:`conveyor.console`)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
from pathlib import Path

import click

from conveyor.cli.common import (
    DAY_S,
    Bounded,
    FilePath,
    app_name,
    host_name,
    load_config_or_exit,
    usage,
    warn,
)

TOKEN_ENV = "CONVEYOR_CONSOLE_TOKEN"


@click.command("console")
@click.option("--config", "config_path", required=True,
              type=FilePath(exists=True, dir_okay=False, path_type=Path),
              help="TOML config of a redis or kafka app (e.g. configs/redis.toml).")
@click.option("--app", default=None, callback=app_name,
              help="Show this app only (its consumer group). Default: every app found.")
@click.option("--host", default="127.0.0.1", show_default=True, callback=host_name,
              help="Address to bind; anything but loopback exposes the console.")
@click.option("--port", type=click.IntRange(0, 65535), default=8089, show_default=True,
              envvar="CONVEYOR_CONSOLE_PORT", show_envvar=True, help="Port to serve on.")
@click.option("--interval", "interval_s", type=Bounded(0.2, DAY_S), default=2.0,
              show_default=True, metavar="SECONDS",
              help="How often the one shared poll loop reads the broker.")
@click.option("--write", is_flag=True,
              help=f"Allow replay, purge and group deletion, with a token (${TOKEN_ENV}, "
                   "or one printed at start).")
def console(config_path: Path, app: str | None, host: str, port: int, interval_s: float,
            write: bool) -> None:
    """A web console: queues and lag, daemons, dead letters, groups.

    Read-only unless --write; then replay, purge and group deletion need the token
    printed at start (or set in $CONVEYOR_CONSOLE_TOKEN). Binds 127.0.0.1 by default.
    The embedded (memory) adapter is refused (exit 2): its state lives in the worker's
    process.

    \b
    Examples:
      conveyor console --config configs/redis.toml
      conveyor console --config configs/redis.toml --app shop --write
    """
    import uvicorn

    from conveyor.console.poller import Poller
    from conveyor.console.server import (
        TOKEN_HEADER,
        HeadDeadline,
        Settings,
        broker_name,
        create_app,
    )

    config = load_config_or_exit(config_path)
    if config.queues.adapter == "memory":
        usage("console: the memory adapter lives inside the worker's process, so its "
              "queues and dead letters exist only there; use --config with a redis or "
              "kafka config (e.g. configs/redis.toml)")
    token = None
    if write:
        token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
        if not _sendable(token):
            usage(f"${TOKEN_ENV}: no request can carry this token in its {TOKEN_HEADER} "
                  "header (it has a newline, a control or non-ASCII character, or a space "
                  "at an end: a secret file's last newline?); use printable ASCII")
    settings = Settings(config, app, token, host, broker_name(config))
    listener = _listen(host, port)  # before the banner: a port in use is one line, exit 2
    port = listener.getsockname()[1]  # --port 0: the port the system chose
    where = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
    click.echo(f"conveyor console on {where} ({settings.broker}); Ctrl-C stops it")
    if host not in ("127.0.0.1", "localhost", "::1"):
        warn(f"bound to {host}: anyone who can reach it sees your queues and dead letters' "
             "bodies")
    if token is None:
        click.echo("read-only: start with --write to replay, purge or delete groups")
    elif os.environ.get(TOKEN_ENV):
        click.echo(f"write actions on: the token is ${TOKEN_ENV}")
    else:
        click.echo(f"write actions on: token {token}")
    poller = Poller(config, app, interval_s)
    server = uvicorn.Server(uvicorn.Config(
        create_app(settings, poller), host=host, port=port, log_level="warning",
        access_log=False, timeout_graceful_shutdown=5, http=HeadDeadline))
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C stops it quietly
        server.run(sockets=[listener])


def _sendable(token: str) -> bool:
    """Whether a client can send ``token`` as it is in a header: HTTP strips the spaces
    at a value's ends, a newline ends the header, and a browser sends no character past
    Latin-1 (and a byte past ASCII is read back as another character). A token that
    cannot be sent made every write action a 403 asking for the token."""
    return token.isascii() and token.isprintable() and token == token.strip()


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for the server; an address that cannot be bound
    (a port in use, a host that is no address here) is a usage error naming both."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        usage(f"--host {host}: not an address to listen on ({exc.strerror or exc})")
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        listener.close()
        taken = exc.errno == errno.EADDRINUSE
        usage(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}"
              + ("; choose another --port" if taken else ""))
    listener.set_inheritable(True)
    return listener
