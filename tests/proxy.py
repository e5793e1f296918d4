"""A TCP proxy in front of a real server, for connection faults (Kafka and Redis tests)."""

from __future__ import annotations

import asyncio


class CuttableProxy:
    """A TCP proxy in front of a broker that a test can cut (an outage) and restore.

    While cut, it refuses connections and has closed every open one, as a network
    partition or a broker host that is down would look to the client. Restore it with
    :meth:`start`.

    :meth:`lose_next_reply` makes the fault that tests idempotence: the next answer the
    server sends is dropped and the connections are closed, so the server has done what
    was asked but the client cannot know.
    """

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._lose_reply = False
        self._then_down = False
        self.replies_lost = 0
        self.accepted = 0
        """Client connections it has taken (each is one the server sees)."""
        self.forwarded = 0
        """Bytes of requests passed on to the server (a test cuts once enough went)."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        self._refuse()
        self._close_all()

    def lose_next_reply(self, *, then_down: bool = False) -> None:
        """Drop the next reply and close every connection; ``then_down``: stay cut after."""
        self._lose_reply, self._then_down = True, then_down

    def _refuse(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer, replies=False),
                             self._pipe(up_reader, writer, replies=True))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    replies: bool) -> None:
        try:
            while data := await reader.read(65536):
                if replies and self._lose_reply:
                    self._lose_reply = False
                    self.replies_lost += 1
                    if self._then_down:
                        self._refuse()
                    self._close_all()
                    return
                if not replies:
                    self.forwarded += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, RuntimeError):
            return  # the proxy was cut: the connection ends here
        finally:
            writer.close()
            self._writers.discard(writer)
