"""The worker's HTTP endpoint (``[http] port``, ``conveyor worker --http-port``).

``GET /metrics``
    The daemon's metrics in the Prometheus text format: the instruments the OTLP export
    has, read by OpenTelemetry's Prometheus reader (see :mod:`conveyor.platform.telemetry`).
``GET /healthz``
    ``200 ok`` whenever it answers: it is served by the event loop that runs the daemon,
    so a handler that blocks the loop makes it time out — what a liveness probe is for.
``GET /readyz``
    ``200 ready`` while the daemon has joined, is not draining and its queues are held
    or being taken; ``503 not ready: <reason>`` otherwise (one line).

It is a small asyncio server rather than ``prometheus_client``'s threaded one, for that
reason: a probe answered from a thread says nothing about the loop. One request per
connection, GET or HEAD, headers bounded (8 KiB: else a 431) and read within 5 s (else a
408); a request line that is not ``METHOD PATH VERSION`` is a 400. Each answer has a
one-line reason, so ``curl`` shows why rather than an empty reply. Nothing here runs per
message.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from conveyor.platform.errors import ConfigError

if TYPE_CHECKING:
    from conveyor.workers.daemon import WorkerDaemon

log = logging.getLogger("conveyor.http")

Readiness = Callable[[], str | None]
"""None when ready, else why not (one line)."""
MetricsText = Callable[[], Awaitable[bytes]]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
REQUEST_TIMEOUT_S = 5.0
MAX_HEADER_BYTES = 8192

Answer = tuple[str, str, bytes]
"""Status line, content type, body."""
BAD_REQUEST: Answer = ("400 Bad Request", TEXT,
                       b"bad request: expected a request line such as GET /metrics HTTP/1.1\n")
TOO_LARGE: Answer = ("431 Request Header Fields Too Large", TEXT,
                     f"request head over {MAX_HEADER_BYTES:,} bytes\n".encode())


class ListenError(ConfigError):
    """The endpoint cannot listen on ``address``: its message names ``$.http.port``, as
    a command that knows where the port was given (an option, a variable) may not."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"$.http.port: cannot listen on {address} ({reason}); "
                         "choose another port or [http] host")


class HttpEndpoint:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (port 0: any free one,
    then read :attr:`port`). :meth:`start` binds, :meth:`close` stops listening."""

    def __init__(self, host: str, port: int, *, metrics: MetricsText,
                 readiness: Readiness) -> None:
        self.host = host
        self.port = port
        self._metrics = metrics
        self._readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen, or raise a :class:`ListenError` (a port in use, an address this host
        does not have)."""
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            # asyncio's own text repeats the address: "error while attempting to bind
            # on address ('127.0.0.1', 9464): address already in use".
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"{self.host}:{self.port}", reason) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics and probes on http://%s:%d (/metrics, /healthz, /readyz)",
                 self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A request that is not one gets a one-line 4xx too: closed unanswered, it read
        # as "empty reply from server", as if the worker had crashed.
        try:
            method, answer = "GET", BAD_REQUEST
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
                request = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                if len(head) > MAX_HEADER_BYTES:
                    answer = TOO_LARGE
                elif len(request) == 3:
                    method, path, _ = request
                    answer = await self._answer(method, path.split("?", 1)[0])
            except asyncio.LimitOverrunError:  # past the reader's own bound (64 KiB)
                answer = TOO_LARGE
            except TimeoutError:
                answer = ("408 Request Timeout", TEXT,
                          f"no whole request head within {REQUEST_TIMEOUT_S:g} s\n".encode())
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return  # closed before a byte: a port check, nothing to answer
            status, content_type, body = answer
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass  # the client went away: nothing to answer
        finally:
            writer.close()

    async def _answer(self, method: str, path: str) -> Answer:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", TEXT, b"only GET and HEAD\n"
        if path == "/healthz":
            return "200 OK", TEXT, b"ok\n"
        if path == "/readyz":
            reason = self._readiness()
            if reason is None:
                return "200 OK", TEXT, b"ready\n"
            return "503 Service Unavailable", TEXT, f"not ready: {reason}\n".encode()
        if path == "/metrics":
            try:
                return "200 OK", METRICS_CONTENT_TYPE, await self._metrics()
            except Exception:
                log.exception("collecting metrics for /metrics failed")
                return "500 Internal Server Error", TEXT, b"collecting metrics failed\n"
        return "404 Not Found", TEXT, b"not found: try /metrics, /healthz or /readyz\n"


def daemon_endpoint(daemon: WorkerDaemon, host: str, port: int) -> HttpEndpoint:
    """The endpoint of one daemon: its meter's Prometheus registry, its readiness."""
    telemetry = daemon.telemetry

    async def metrics() -> bytes:
        return telemetry.prometheus_text()

    return HttpEndpoint(host, port, metrics=metrics, readiness=daemon.readiness)
