"""The console's HTTP server: a connection that does not send a whole request head in
time is closed (slowloris), while requests that are slow to answer, keep-alive and
pipelined requests are served as before. A real uvicorn on a real socket, with the
deadline shortened; the same test on uvicorn's own protocol shows what it changes."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from conveyor.console import server
from conveyor.console.server import HeadDeadline

DEADLINE_S = 0.5


async def answer(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params.get("wait", 0)))
    return PlainTextResponse("ok")


async def serving(protocol: type[asyncio.Protocol]) -> AsyncIterator[int]:
    app = Starlette(routes=[Route("/", answer)])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off")
    running = uvicorn.Server(config)
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
