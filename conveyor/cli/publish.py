"""``conveyor publish``: one message to a stream, from outside the app (a redis or kafka
config); prints the message's sequence token."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import click

from conveyor.cli.common import (
    FilePath,
    broker_config_option,
    fail,
    load_config_or_exit,
    refuse_embedded,
    run_command,
    usage,
)
from conveyor.platform.errors import ConveyorError, InvalidArgumentError
from conveyor.platform.ids import SequenceToken, key_problem, namespace_problem, shown_name


@click.command()
@click.argument("namespace")
@click.argument("key")
@click.argument("body", required=False)
@broker_config_option
@click.option("--header", "-H", multiple=True, help="NAME=VALUE, repeatable.")
@click.option("--content-type", default=None, help="Defaults to application/json.")
@click.option("--body-file", type=FilePath(exists=True, dir_okay=False, allow_dash=True),
              help="Read the body from this file ('-': stdin) instead of BODY.")
def publish(
    namespace: str,
    key: str,
    body: str | None,
    config_path: Path | None,
    header: tuple[str, ...],
    content_type: str | None,
    body_file: str | None,
) -> None:
    """Publish one message to a stream and print its sequence token.

    BODY goes to the stream NAMESPACE/KEY as it is (JSON by default: a BODY that is not
    JSON is refused unless --content-type says otherwise; a type neither text/* nor
    JSON sends the bytes the shell passed); the token printed is QUEUE:MAJOR-MINOR,
    which `conveyor rewind --to` takes. --body-file gives the body instead of BODY,
    read from a file or stdin ('-'), at most [queues] max_body_bytes.

    \b
    Examples:
      conveyor publish orders order-17 '{"id": 17}' --config configs/redis.toml
      conveyor publish orders order-17 '{"id": 17}' -H tenant=acme
      conveyor publish orders order-17 --body-file -   # the body on stdin
    """
    import msgspec

    from conveyor.client import Client
    from conveyor.platform.message import CONTENT_JSON, CONTENT_TEXT

    if not namespace:  # an empty '' argument: the user's mistake, before any I/O
        raise click.BadParameter("must be a non-empty string", param_hint="NAMESPACE")
    if not key:  # an unset shell variable, most likely
        raise click.BadParameter("must be a non-empty string", param_hint="KEY")
    for hint, value, problem in (("NAMESPACE", namespace, namespace_problem(namespace)),
                                 ("KEY", key, key_problem(key))):
        if problem is not None:  # as the client would refuse it, but before any I/O
            raise click.BadParameter(f"{shown_name(value, quoted=True)} {problem}",
                                     param_hint=hint)
    if content_type is not None and not _MEDIA_TYPE.fullmatch(content_type.partition(";")[0]):
        raise click.BadParameter(
            f"{content_type!r} is not a media type TYPE/SUBTYPE (e.g. text/plain)",
            param_hint="--content-type")
    if (body is None) == (body_file is None):
        raise click.UsageError("give the body as BODY or as --body-file, one of them"
                               f"{', not both' if body is not None else ''}")
    headers = _headers(header)
    config = load_config_or_exit(config_path)
    refuse_embedded(config, "publish", "a message published from here would vanish when "
                    "this command exits (publish from the worker's process instead, e.g. "
                    "in an @app.startup hook)")
    hint = "BODY"
    if body_file is not None:
        body, hint = _read_body(body_file, config.queues.max_body_bytes), "--body-file"
    assert body is not None
    if content_type in (None, CONTENT_JSON):
        # Sent as it is, a body that is not JSON was dead-lettered later by its worker.
        shown = body if len(body) <= 60 else f"{body[:57]}..."
        try:
            msgspec.json.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if body == "-" and hint == "BODY":  # as many commands read stdin
                raise click.BadParameter("'-' is not read from standard input: give "
                                         "--body-file - for that; nothing was sent",
                                         param_hint=hint) from None
            raise click.BadParameter(
                f"{shown!r} is not JSON ({exc}); to send it as text, add "
                f"--content-type {CONTENT_TEXT}", param_hint=hint) from None
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8
            raise click.BadParameter(
                f"{shown!r} is not UTF-8 text, so not JSON; to send these bytes, add "
                "--content-type application/octet-stream; nothing was sent",
                param_hint=hint) from None
        except RecursionError:  # no handler could decode it either
            raise click.BadParameter(
                f"{shown!r} is JSON nested too deeply to decode; nothing was sent",
                param_hint=hint) from None
    data: str | bytes = body
    if content_type is not None and not _textual(content_type):
        data = os.fsencode(body)  # a binary type: the bytes the shell passed, as they are
    async def send() -> SequenceToken:
        client = Client.from_config(config)
        try:
            return await client.publish(namespace, key, data, headers, content_type)
        except asyncio.CancelledError:
            # Ctrl-C. close() would wait for the send under way (to a broker that is down:
            # all of [redis] retry_max_s); stopped, the message may or may not be stored.
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            raise
        finally:
            await client.close()

    try:
        token = run_command(send())
    except InvalidArgumentError as exc:
        usage(str(exc))
    except ConveyorError as exc:
        fail(exc)
    click.echo(str(token))


def _headers(header: tuple[str, ...]) -> dict[str, str]:
    """``-H NAME=VALUE`` options as a dict; a malformed, reserved or repeated name is a
    usage error naming ``--header``."""
    from conveyor.platform.message import RESERVED_HEADERS

    headers: dict[str, str] = {}
    for item in header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--header")
        if name in RESERVED_HEADERS:
            raise click.BadParameter(
                f"{name!r} is reserved by the wire format (the command sets it: "
                f"{', '.join(sorted(RESERVED_HEADERS))}; content type: --content-type)",
                param_hint="--header",
            )
        if name in headers:
            raise click.BadParameter(f"{name!r} given twice", param_hint="--header")
        headers[name] = value
    return headers


def _read_body(path: str, limit: int) -> str:
    """The body in the file at ``path`` (``-``: stdin), read as the shell passes BODY
    (bytes that are not UTF-8 kept as ``os.fsdecode`` keeps them) and at most ``limit``
    bytes: a larger one is a usage error naming ``--body-file`` before it is read whole
    (``/dev/zero`` would never end)."""
    try:
        with click.open_file(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}",
                                 param_hint="--body-file") from None
    if len(data) > limit:
        raise click.BadParameter(
            f"{'stdin' if path == '-' else path} is larger than $.queues.max_body_bytes "
            f"({limit} bytes); nothing was sent", param_hint="--body-file")
    return os.fsdecode(data)


_MEDIA_TYPE = re.compile(r"\s*[\w.+-]+/[\w.+-]+\s*")
"""A media type's TYPE/SUBTYPE (RFC 6838's characters, less the rarest), before any
``;`` parameters."""


def _textual(content_type: str) -> bool:
    """Whether a body of ``content_type`` is text (sent as UTF-8, so it must be text):
    ``text/*`` and JSON types. Others are bytes, sent as the shell passed them."""
    kind = content_type.partition(";")[0].strip().lower()
    return kind.startswith("text/") or kind.endswith(("/json", "+json"))
