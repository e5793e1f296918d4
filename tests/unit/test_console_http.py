"""The console's HTTP server: a connection that does not send a whole request head in
time is closed (slowloris), while requests that are slow to answer, keep-alive and
pipelined requests are served as before; a write action whose body does not come gets a
408 and holds none of the broker's turns meanwhile. A real uvicorn on a real socket
(and a real redis-server for the console's app), with the deadlines shortened; the same
test on uvicorn's own protocol shows what the head's deadline changes."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from conveyor.console import server
from conveyor.console.poller import Poller
from conveyor.console.server import (
    BROKER_CALLS,
    TOKEN_HEADER,
    HeadDeadline,
    Settings,
    broker_name,
    create_app,
)
from conveyor.platform.config import load_config
from tests.conftest import process_stopped, wait_until
from tests.integration.redis.conftest import write_config
from tests.servers import RedisServer
from tests.unit.test_console import APP, TOKEN, prepare_app

DEADLINE_S = 0.5


async def answer(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params.get("wait", 0)))
    return PlainTextResponse("ok")


async def serving(protocol: type[asyncio.Protocol], app: Starlette | None = None,
                  servers: list[uvicorn.Server] | None = None) -> AsyncIterator[int]:
    """The port of a uvicorn serving ``app`` (appended to ``servers``, when given)."""
    app = app or Starlette(routes=[Route("/", answer)])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, log_level="warning", lifespan="on")
    running = uvicorn.Server(config)
    if servers is not None:
        servers.append(running)
    task = asyncio.create_task(running.serve(sockets=[listener]))
    while not running.started:
        await asyncio.sleep(0.01)
        assert not task.done(), task
    try:
        yield listener.getsockname()[1]
    finally:
        running.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def port(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[int]:
    monkeypatch.setattr(server, "HEAD_TIMEOUT_S", DEADLINE_S)
    async for bound in serving(HeadDeadline):
        yield bound


async def closed_after(port: int, drip: bytes = b"", every_s: float = 0.1,
                       limit_s: float = 5.0) -> float | None:
    """Seconds until the server closed a connection that sends ``drip`` a byte every
    ``every_s`` (nothing, when empty); None: still open after ``limit_s``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    try:
        for byte in drip:
            writer.write(bytes([byte]))
            try:
                if await asyncio.wait_for(reader.read(), every_s) == b"":
                    return time.monotonic() - start
            except TimeoutError:
                continue
        try:
            left = limit_s - (time.monotonic() - start)
            got = await asyncio.wait_for(reader.read(), max(left, 0.01))
        except TimeoutError:
            return None
        assert got == b"", got  # no answer to a head that never ended
        return time.monotonic() - start
    finally:
        writer.close()


async def request(port: int, *paths: str) -> list[bytes]:
    """The bodies of GETs of ``paths`` sent on one connection back to back (pipelined)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(f"GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
                              for p in paths))
        bodies = []
        for _ in paths:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.append(await reader.readexactly(length))
        return bodies
    finally:
        writer.close()


async def test_a_silent_connection_is_closed_at_the_deadline(port: int) -> None:
    waited = await closed_after(port)
    assert waited is not None and DEADLINE_S * 0.9 <= waited < DEADLINE_S + 2, waited


async def test_an_upgrade_header_is_answered_and_logged_without_advice_to_install_anything(
    port: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """uvicorn logged, for any client's ``Upgrade: websocket``, a line telling the
    operator to pip install a WebSocket library; the console serves none."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn")]
    assert logged == ["Unsupported upgrade request."], logged


async def test_a_head_sent_a_byte_at_a_time_is_cut_off_at_the_deadline(port: int) -> None:
    head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    waited = await closed_after(port, head)  # 200 bytes at 0.1 s: 20 s if never cut
    assert waited is not None and DEADLINE_S * 0.9 <= waited < DEADLINE_S + 2, waited


async def test_answers_slower_than_the_deadline_keep_alive_and_pipelining_still_work(
    port: int,
) -> None:
    assert await request(port, f"/?wait={DEADLINE_S * 3}") == [b"ok"]
    assert await request(port, "/", "/?wait=0.1", "/") == [b"ok"] * 3
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:  # a kept-alive connection gets a fresh deadline after each answer
        for _ in range(3):
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
            await asyncio.sleep(DEADLINE_S / 2)
        assert await asyncio.wait_for(reader.read(), DEADLINE_S + 2) == b""  # then idle
    finally:
        writer.close()


async def test_uvicorn_alone_holds_a_silent_connection() -> None:
    """The control: without :class:`HeadDeadline` the same connection stays open."""
    async for bound in serving(H11Protocol):
        assert await closed_after(bound, limit_s=DEADLINE_S * 4) is None


def stalled_write(port: int) -> bytes:
    """A replay's head, with the token, announcing a body of which one byte is sent."""
    return (f"POST /api/letters/replay HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"{TOKEN_HEADER}: {TOKEN}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{").encode()


async def answer_to(reader: asyncio.StreamReader,
                    within_s: float) -> tuple[bytes, dict[str, Any]]:
    """The status line and JSON body of one answer on ``reader``."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within_s)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await asyncio.wait_for(reader.readexactly(length), within_s)
    return head.split(b"\r\n", 1)[0], json.loads(body)


@pytest.mark.redis
async def test_write_bodies_that_never_come_get_a_408_and_hold_no_broker_turn(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each write action read its body holding one of the BROKER_CALLS turns, with no
    deadline: four clients that announced a body and sent a byte of it held every turn
    for as long as they stayed, and the dead-letter list waited for them (timed out)."""
    body_deadline_s = 4.0
    monkeypatch.setattr(server, "BODY_TIMEOUT_S", body_deadline_s, raising=False)
    config = load_config(write_config(tmp_path / "redis.toml", redis_server.url,
                                      queues={"total": 2}))
    await asyncio.to_thread(prepare_app, config)
    settings = Settings(config, None, TOKEN, "127.0.0.1", broker_name(config))
    console = create_app(settings, Poller(config, None, interval_s=0.2))
    async for port in serving(HeadDeadline, console):
        stalled = [await asyncio.open_connection("127.0.0.1", port)
                   for _ in range(BROKER_CALLS + 1)]
        try:
            for _, writer in stalled:
                writer.write(stalled_write(port))
                await writer.drain()
            sent = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /api/letters?app={APP} HTTP/1.1\r\nHost: 127.0.0.1:{port}"
                         "\r\n\r\n".encode())
            status, listed = await answer_to(reader, body_deadline_s / 2)
            writer.close()
            assert (status, listed["total"]) == (b"HTTP/1.1 200 OK", 3)
            for stalled_reader, _ in stalled:
                status, refused = await answer_to(stalled_reader, body_deadline_s + 5)
                assert status == b"HTTP/1.1 408 Request Timeout", (status, refused)
                assert refused["error"] == (f"the body did not arrive within "
                                            f"{body_deadline_s:g} s; nothing was done")
            assert time.monotonic() - sent >= body_deadline_s * 0.9
            # A client that goes away mid-body is its doing: no traceback in the log.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(stalled_write(port))
            await writer.drain()
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /api/letters?app={APP} HTTP/1.1\r\nHost: 127.0.0.1:{port}"
                         "\r\n\r\n".encode())
            status, listed = await answer_to(reader, 10)
            writer.close()
            assert (status, listed["total"]) == (b"HTTP/1.1 200 OK", 3)  # nothing done
        finally:
            for _, stalled_writer in stalled:
                stalled_writer.close()
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failed, failed


def letters_request(port: int) -> bytes:
    return f"GET /api/letters?app={APP} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def bodies_taken(running: uvicorn.Server) -> bool:
    """Whether every request on ``running``'s connections is under way, its body read by
    the app (the app is waiting for a turn or the broker, not for the client)."""
    cycles = [getattr(c, "cycle", None) for c in running.server_state.connections]
    return all(c is not None and not c.body and not c.more_body for c in cycles)


@pytest.mark.redis
async def test_a_client_that_goes_away_frees_its_broker_turn_and_its_action_is_not_done(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Against a Redis that accepts and does not answer (paused), a read waits out the
    adapter's retries ([redis] retry_max_s). A request whose client had given up kept
    its turn, and its read ran on: twelve page loads given up held the four turns for
    three retries each (38 s with the defaults) before the next page had one; and an
    action whose client had gone ran once a turn came, unseen."""
    retry_max_s = 3.0
    config = load_config(write_config(tmp_path / "redis.toml", redis_server.url,
                                      queues={"total": 2},
                                      redis={"url": redis_server.url, "prefix": "t",
                                             "socket_timeout_s": 1.0,
                                             "retry_max_s": retry_max_s}))
    await asyncio.to_thread(prepare_app, config)
    settings = Settings(config, None, TOKEN, "127.0.0.1", broker_name(config))
    console = create_app(settings, Poller(config, None, interval_s=0.2))
    redis = redis_server.process.proc
    assert redis is not None
    servers: list[uvicorn.Server] = []

    def under_way() -> int:
        return len(servers[0].server_state.tasks)

    def read() -> bool:
        return bodies_taken(servers[0])

    async for port in serving(HeadDeadline, console, servers):
        redis.send_signal(signal.SIGSTOP)
        try:
            await wait_until(lambda: process_stopped(redis.pid), 10, what="redis to stop")
            gone = [await asyncio.open_connection("127.0.0.1", port)
                    for _ in range(BROKER_CALLS * 3)]
            for _, writer in gone:
                writer.write(letters_request(port))
            await wait_until(lambda: under_way() == BROKER_CALLS * 3 and read(), 5,
                             what="every read under way")
            for _, writer in gone:
                writer.close()
            left = time.monotonic()
            await wait_until(lambda: not under_way(), retry_max_s * 2,
                             what="the reads of the clients gone to end")
            assert time.monotonic() - left < retry_max_s / 2  # not one retry waited out
            # Four reads whose clients wait hold every turn; a replay of every letter
            # waits for one, and its client goes.
            staying = [await asyncio.open_connection("127.0.0.1", port)
                       for _ in range(BROKER_CALLS)]
            for _, writer in staying:
                writer.write(letters_request(port))
            body = json.dumps({"app": APP, "all": True}).encode()
            _, replaying = await asyncio.open_connection("127.0.0.1", port)
            replaying.write(
                f"POST /api/letters/replay HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"{TOKEN_HEADER}: {TOKEN}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await wait_until(lambda: under_way() == BROKER_CALLS + 1 and read(), 5,
                             what="the replay waiting")
            replaying.close()
            await wait_until(lambda: under_way() == BROKER_CALLS, 5,
                             what="the replay dropped")
        finally:
            redis.send_signal(signal.SIGCONT)
        for reader, writer in staying:
            status, listed = await answer_to(reader, retry_max_s * 3)
            writer.close()
            assert (status, listed["total"]) == (b"HTTP/1.1 200 OK", 3)
        await wait_until(lambda: not under_way(), 10, what="every request")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(letters_request(port))
        status, listed = await answer_to(reader, 10)
        writer.close()
        assert (status, listed["total"]) == (b"HTTP/1.1 200 OK", 3)  # nothing replayed
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failed, failed
