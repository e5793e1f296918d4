"""The console's web app: pages, the JSON API under ``/api``, and the write guard.

Pages are one server-rendered shell each (navigation, the broker, the mode); the small
script in ``static/console.js`` fills them from the JSON API at the poll interval. The
API never shows a secret: the broker is named through the adapters' redacting helpers,
and nothing of the config beyond queue counts is served.

Write actions (replay, purge, delete a group) exist only when the console was started
with ``--write``, and then each needs the token in the ``X-Conveyor-Token`` header of a
JSON POST. Browsers send neither a custom header nor a JSON body cross-site without a
CORS preflight, which this app never answers, so another site cannot forge one (no
cookie is ever set); a request whose ``Origin`` is another site is refused as well, and
the ``Host`` must be the one bound (no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from importlib.resources import files
from string import Template
from typing import Any, TypeVar
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

from conveyor.console import actions
from conveyor.console.actions import Choice, RequestError
from conveyor.console.poller import Poller, Reading, rates
from conveyor.platform.config import Config
from conveyor.platform.errors import (
    AppAliveError,
    ConfigError,
    ConveyorError,
    InvalidArgumentError,
    UnknownGroupError,
    error_text,
)
from conveyor.platform.ids import is_app_name

log = logging.getLogger(__name__)

T = TypeVar("T")

TOKEN_HEADER = "X-Conveyor-Token"
MAX_BODY = 1 << 20
"""Bytes a write action's body may have (1,000 ids of 200 characters fit in a quarter)."""
HEAD_TIMEOUT_S = 10.0
"""Seconds a connection has to send a whole request head, from its opening or from the
end of its last response (:class:`HeadDeadline`)."""
BODY_TIMEOUT_S = 10.0
"""Seconds a write action's body has, once its head arrived, to arrive whole: else a 408
(a client that stalls or vanishes mid-body would hold its request forever)."""
BROKER_CALLS = 4
"""Requests that read or write the broker at once (letters, a letter, the write actions);
more wait their turn rather than each opening connections of its own. A write action
takes its turn once its body is read: four bodies that never arrived held every turn,
and the dead-letter pages waited for them."""
PAGES = {"overview": "Overview", "daemons": "Daemons", "letters": "Dead letters",
         "groups": "Groups"}


@dataclass(frozen=True)
class Settings:
    config: Config
    app: str | None
    token: str | None
    """None: read-only (no write action exists)."""
    host: str
    broker: str
    """Where the queues are, redacted."""


class HeadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a deadline on each request's head.

    uvicorn times a connection out only between two requests (its keep-alive timeout,
    restarted by every byte); one that opens and sends nothing, or a header a byte at a
    time, is held forever — exposed with ``--host 0.0.0.0``, a handful of such clients
    (slowloris) would hold the console's sockets. Here a connection whose head is not
    whole :data:`HEAD_TIMEOUT_S` after it opened (or after its last response) is closed.
    A request being answered, or its body, has no deadline from this."""

    _deadline: asyncio.TimerHandle | None = None
    _waiting_after: object = None
    """The cycle (request) the deadline was set after: a new one means a head arrived."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._disarm_if_head()

    def on_response_complete(self) -> None:
        self._arm()
        super().on_response_complete()  # may start the next, pipelined request
        self._disarm_if_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = self.cycle
        self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _disarm_if_head(self) -> None:
        if self.cycle is not self._waiting_after:
            self._disarm()

    def _late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn's own adds, to any client's Upgrade header, a second line telling the
        # operator to pip install a WebSocket library: the console serves no WebSocket.
        self.logger.warning("Unsupported upgrade request.")


def broker_name(config: Config) -> str:
    """The broker as the pages name it, with no password in it."""
    from conveyor.backends import backend

    return backend(config.queues.adapter).where(config)


def _shell(settings: Settings, page: str) -> str:
    template = Template((files("conveyor.console") / "page.html").read_text())
    nav = " ".join(
        f'<a href="/{"" if name == "overview" else name}" '
        f'class="{"here" if name == page else ""}">{title}</a>'
        for name, title in PAGES.items())
    return template.substitute(
        title=html.escape(PAGES[page]), page=page, nav=nav,
        broker=html.escape(settings.broker),
        mode="write" if settings.token is not None else "read-only",
        app=html.escape(settings.app or ""),
    )


def create_app(settings: Settings, poller: Poller) -> Starlette:
    """The ASGI app; ``poller`` runs for the app's lifetime."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        poller.start()
        try:
            yield
        finally:
            await poller.stop()

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(_: Request) -> Response:
            return HTMLResponse(_shell(settings, name),
                                headers={"Content-Security-Policy": CSP})
        return endpoint

    async def overview(_: Request) -> Response:
        reading = await poller.current()
        status = {name: _status_json(report) for name, report in reading.status.items()}
        return JSONResponse({
            "at": reading.at, "error": reading.error, "warnings": reading.warnings,
            "broker": settings.broker,
            "write": settings.token is not None, "interval_s": poller.interval_s,
            "polls": poller.polls,
            "apps": [] if reading.apps is None else [asdict(a) for a in reading.apps.apps],
            "retention_follows_groups": (reading.apps.retention_follows_groups
                                         if reading.apps is not None else None),
            "status": status,
        })

    async def charts(request: Request) -> Response:
        reading = await poller.current()
        app = _app_param(request.query_params.get("app"), settings)
        if app != settings.app and not _polled(reading, app) and not poller.history(app):
            # an app with letters only, or a typo: ask the broker
            await broker_read(request, lambda: actions.require_app(settings.config, app))
        return JSONResponse({"app": app, "interval_s": poller.interval_s,
                             "points": rates(poller.history(app))})

    async def letters(request: Request) -> Response:
        q = request.query_params
        app = _app_param(q.get("app"), settings)
        choice = Choice(app, handler=actions.check_text("handler", q.get("handler")),
                        error_type=actions.check_text("error_type", q.get("error_type")),
                        stream=actions.check_text("stream", q.get("stream")),
                        known=app == settings.app)
        return JSONResponse(await actions.list_letters(settings.config, choice))

    async def letter(request: Request) -> Response:
        app = _app_param(request.query_params.get("app"), settings)
        letter_id = actions.check_text("id", request.path_params["letter_id"], required=True)
        return JSONResponse(await actions.show_letter(settings.config, app, letter_id or "",
                                                      known=app == settings.app))

    broker_calls = asyncio.Semaphore(BROKER_CALLS)

    async def broker_read(request: Request, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` in one of :data:`BROKER_CALLS` turns (each opens the broker's
        connections, as a CLI command does: a burst of requests would open a burst),
        waited for and done only while the client waits (:func:`_unless_gone`): a read
        changes nothing, and a client that gave up on a broker that does not answer kept
        its turn for the adapter's whole retry (10 s), every turn with four of them, and
        the next page waited for each in turn."""

        async def in_turn() -> T:
            async with broker_calls:
                return await work()

        return await _unless_gone(request, in_turn())

    def gated(endpoint: Callable[[Request], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """``endpoint`` as a :func:`broker_read`."""

        async def limited(request: Request) -> Response:
            return await broker_read(request, lambda: endpoint(request))

        return limited

    # The write actions read and check their body first, then take a turn: the body
    # comes at the client's pace, and a turn held while it came was a turn taken from
    # every dead-letter page (four stalled bodies held them all). A client gone while
    # its action waits for a turn gets none (nothing is done); once it has one, the
    # action runs to its end, as the CLI's would.
    async def replay(request: Request) -> Response:
        choice = await _write_choice(request, settings)
        async with _turn(broker_calls, request):
            return JSONResponse(await actions.replay_letters(settings.config, choice))

    async def purge(request: Request) -> Response:
        body = await _write_body(request, settings)
        if body.get("confirm") is not True:
            raise RequestError(400, "purge deletes letters for good: send \"confirm\": true")
        choice = _choice(body, settings)
        async with _turn(broker_calls, request):
            return JSONResponse(await actions.purge_letters(settings.config, choice))

    async def delete_group(request: Request) -> Response:
        body = await _write_body(request, settings)
        # Named, never the --app default; and within --app, as every other action: a
        # console shown one app deleted another's group.
        app = _app_param(actions.check_text("app", body.get("app"), required=True), settings)
        if body.get("confirm") is not True:
            raise RequestError(400, "deleting a group is for good: send \"confirm\": true")
        async with _turn(broker_calls, request):
            return JSONResponse(await actions.delete_group(settings.config, app))

    routes = [
        Route("/", page("overview")),
        *(Route(f"/{name}", page(name)) for name in PAGES if name != "overview"),
        Route("/api/overview", _guarded(overview)),
        Route("/api/charts", _guarded(charts)),
        Route("/api/letters", _guarded(gated(letters))),
        OwnedRoute("/api/letters/replay", _guarded(replay), methods=["POST"]),
        OwnedRoute("/api/letters/purge", _guarded(purge), methods=["POST"]),
        Route("/api/letters/{letter_id:path}", _guarded(gated(letter))),
        OwnedRoute("/api/groups/delete", _guarded(delete_group), methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("conveyor.console", "static")]),
              name="static"),
    ]
    hosts = sorted({settings.host, "127.0.0.1", "localhost", "[::1]"})
    if settings.host in ("0.0.0.0", "::"):
        hosts = ["*"]  # bound everywhere on purpose: any name may reach it
    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)],
                     exception_handlers={HTTPException: _http_error})


CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'none'")


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # a 405's Allow header kept, as HTTP asks
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                        headers=exc.headers)


class OwnedRoute(Route):
    """A route whose path is its own for every method: one it does not take is a 405
    naming those it does (``Allow``). Starlette would try the next route first, and
    ``GET /api/letters/replay`` reached ``/api/letters/{letter_id:path}``: a 400 for a
    letter named ``replay``."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        return (Match.FULL if match is Match.PARTIAL else match), child


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
    """Errors as JSON with a message and a 4xx (bad input) or 5xx (the console's config,
    the broker); never a traceback."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except RequestError as exc:
            return _error(exc.status, str(exc))
        except UnknownGroupError as exc:
            return _error(404, str(exc))
        except InvalidArgumentError as exc:
            return _error(400, str(exc))
        except ConfigError as exc:  # the console's own config (a password the broker
            return _error(500, f"the console's config: {exc}")  # refuses): not the request's
        except AppAliveError as exc:
            return _error(409, str(exc))
        except ConveyorError as exc:  # the broker failing
            return _error(502, error_text(exc))
        except Exception:
            log.exception("console: %s %s failed", request.method, request.url.path)
            return _error(500, "the console failed on this request (its log says why)")

    return run


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed its connection (after its body, if it is read
    before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; or, should the client close its connection first, ``work``
    cancelled and waited for, and a :class:`RequestError` (no one reads the answer)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise RequestError(400, "the client closed the connection before the answer; "
                           "nothing was done")
    return task.result()


@asynccontextmanager
async def _turn(turns: asyncio.Semaphore, request: Request) -> AsyncIterator[None]:
    """One of ``turns``, waited for only while the client waits (:func:`_unless_gone`)."""
    take = asyncio.ensure_future(turns.acquire())
    try:
        await _unless_gone(request, take)
    except BaseException:
        if take.done() and not take.cancelled() and take.exception() is None:
            turns.release()  # taken as this request was cancelled: not ours to keep
        raise
    try:
        yield
    finally:
        turns.release()


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def _polled(reading: Reading, app: str) -> bool:
    """Whether the last poll found ``app``'s group, or cannot tell (it failed: the charts
    answer from what was polled before, at once, as with the broker down)."""
    if reading.apps is None or reading.error is not None:
        return True
    return any(a.app == app for a in reading.apps.apps)


def _app_param(value: Any, settings: Settings) -> str:
    app = actions.check_text("app", value) or settings.app
    if app is None:
        raise RequestError(400, "app: required (the console watches every app: name one)")
    if settings.app is not None and app != settings.app:
        raise RequestError(404, f"app: this console shows app {settings.app!r} only")
    if not is_app_name(app):  # else the store refuses it, as the console's ConfigError
        raise RequestError(400, f"app: {app!r} is not an app name: use 1-128 ASCII letters, "
                                "digits, '-', '_' or '.' (it names the consumer group)")
    return app


async def _write_body(request: Request, settings: Settings) -> dict[str, Any]:
    """The JSON body of a write action, once the token, the origin and the type pass."""
    if settings.token is None:
        raise RequestError(403, "the console is read-only: start it with --write to replay, "
                            "purge or delete")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise RequestError(403, "cross-site request refused")
    given = request.headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(given.encode(), settings.token.encode()):
        raise RequestError(403, f"write actions need the console's token in the {TOKEN_HEADER} "
                            "header (printed when the console started)")
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":  # a media type is case-insensitive (RFC 9110)
        raise RequestError(415, "send the action as application/json")
    data = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                data += chunk
                if len(data) > MAX_BODY:  # stop reading: a legitimate action is a few kB
                    raise RequestError(413, f"the body must be at most {MAX_BODY:,} bytes")
    except TimeoutError:
        raise RequestError(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s; "
                           "nothing was done") from None
    except ClientDisconnect:  # the client's doing, not the console failing: no traceback
        raise RequestError(400, "the client closed the connection before its body "
                           "arrived; nothing was done") from None
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
        raise RequestError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    return body


def _choice(body: dict[str, Any], settings: Settings) -> Choice:
    every = body.get("all") is True
    ids = actions.check_ids(body.get("ids", []))
    if every == bool(ids):
        raise RequestError(400, "give either \"all\": true or \"ids\": [...], not both or neither")
    app = _app_param(body.get("app"), settings)
    return Choice(app, ids, every,
                  actions.check_text("handler", body.get("handler")),
                  actions.check_text("error_type", body.get("error_type")),
                  actions.check_text("stream", body.get("stream")), known=app == settings.app)


async def _write_choice(request: Request, settings: Settings) -> Choice:
    return _choice(await _write_body(request, settings), settings)


def _status_json(report: Any) -> dict[str, Any]:
    out = asdict(report)
    out["total_lag"] = report.total_lag
    out["rates"] = {str(q): r for q, r in report.rates().items()}
    return out
