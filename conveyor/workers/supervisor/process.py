"""One supervised daemon process, as the supervisor holds it: start, commands, stop.

The child runs :mod:`conveyor.workers.supervisor.child`; the two talk in the messages
of :mod:`conveyor.workers.supervisor.protocol`. Every command is answered by an event,
and a caller waits for that answer: a child that exits instead fails the wait with
:class:`ChildGone`, one that reports a failure with :class:`ChildCommandFailed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from conveyor.platform.errors import ConfigError, ConveyorError
from conveyor.workers.supervisor.protocol import (
    CONFIG_REFUSED,
    Acquire,
    Acquired,
    Command,
    Event,
    Failed,
    ProtocolError,
    Ready,
    Release,
    Released,
    Stop,
    Stopped,
    decode_event,
    encode,
)

log = logging.getLogger("conveyor.supervisor")

CHILD_MODULE = "conveyor.workers.supervisor.child"

E = TypeVar("E", bound=Event)

_ANSWER_TO: dict[str, type[Acquired] | type[Released]] = {
    "acquire": Acquired, "release": Released,
}
"""The event a :class:`Failed` stands in for, by its ``op``."""


class ChildGone(ConveyorError):
    """A child process exited while the supervisor was waiting for it."""



class ChildCommandFailed(ConveyorError):
    """A child could not acquire or release a queue (it reported the error)."""


class ChildProcess:
    """One supervised daemon process and its control channel."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.queues: set[int] = set()
        self.proc: asyncio.subprocess.Process | None = None
        self._waiters: dict[tuple[type[Any], int | None], asyncio.Future[Any]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self.alive = False
        self._exited = False  # its event channel closed: nothing more will come
        self.report = ""
        self.counts: dict[str, int] = {}
        """The fields of its drain report, once it stopped and sent one."""
        self.member_id = ""
        self.http_port: int | None = None
        """The loopback port of its /metrics and probes, when [http] port is set."""
        self.heard_at = time.monotonic()
        """When its last event (a beat, at least every ``BEAT_S``) was read."""

    async def start(self, app_path: str, config_path: str, env: Mapping[str, str],
                    config_text: bytes | None = None) -> None:
        """Start the child; with ``config_text`` it parses those bytes (an unlinked
        temporary file it inherits) and names ``config_path`` only in errors."""
        read_fd, write_fd = os.pipe()
        with contextlib.ExitStack() as stack:
            stack.callback(os.close, write_fd)
            args, fds = [app_path, config_path, str(write_fd)], [write_fd]
            if config_text is not None:
                text = stack.enter_context(tempfile.TemporaryFile())
                text.write(config_text)
                text.flush()
                text.seek(0)
                args.append(str(text.fileno()))
                fds.append(text.fileno())
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", CHILD_MODULE, *args,
                stdin=asyncio.subprocess.PIPE, pass_fds=fds,
                env={**os.environ, **env}, start_new_session=True,
            )
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        ready = self._expect(Ready)
        self._reader_task = asyncio.create_task(self._read(reader))
        try:
            event = await ready
        except ChildGone:
            where = f"process #{self.number} exited before it was ready"
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(self.proc.wait(), 5.0) == CONFIG_REFUSED:
                    raise ConfigError(
                        f"{where}: it refused the configuration (its error is logged "
                        "above with its pid)"
                    ) from None
            raise ChildGone(f"{where} (its error is logged above with its pid)") from None
        self.http_port = event.http_port
        self.member_id = event.id
        self.alive = True

    def _expect(self, kind: type[E], queue: int | None = None) -> asyncio.Future[E]:
        fut: asyncio.Future[E] = asyncio.get_running_loop().create_future()
        if self._exited:  # asking a dead child would wait forever
            fut.set_exception(ChildGone(f"process #{self.number} exited"))
        else:
            self._waiters[(kind, queue)] = fut
        return fut

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            self.heard_at = time.monotonic()
            try:
                event = decode_event(line)
            except ProtocolError as exc:  # a newer or broken child: not worth a crash
                log.warning("process #%d: %s; ignored", self.number, exc)
                continue
            self._answer(event)
        self.alive = False  # the child closed its end: it has exited (or crashed)
        self._exited = True
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ChildGone(f"process #{self.number} exited"))
        self._waiters.clear()

    def _answer(self, event: Event) -> None:
        queue = getattr(event, "queue", None)
        if isinstance(event, Failed):
            fut = self._waiters.pop((_ANSWER_TO[event.op], queue), None)
            if fut is not None and not fut.done():
                fut.set_exception(ChildCommandFailed(
                    f"process #{self.number} could not {event.op} queue {queue}: "
                    f"{event.error}"
                ))
            return
        fut = self._waiters.pop((type(event), queue), None)
        if fut is not None and not fut.done():
            fut.set_result(event)

    def _send(self, command: Command) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(encode(command))

    async def acquire(self, queue: int) -> None:
        done = self._expect(Acquired, queue)
        self._send(Acquire(queue))
        await done
        self.queues.add(queue)

    async def release(self, queue: int) -> None:
        """Returns once the child has drained the queue and shut its receiver down."""
        done = self._expect(Released, queue)
        self._send(Release(queue))
        try:
            await done
        except ChildCommandFailed:
            self.queues.discard(queue)  # the child dropped it; it is adopted next tick
            raise
        self.queues.discard(queue)

    async def kill(self) -> None:
        """SIGKILL (a stopped process too) and wait until its event channel closes, so
        that it is not ``alive`` any more when this returns."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(Exception):
                await self._reader_task

    @property
    def ended(self) -> str:
        """How the process ended, for a log line (``exit status 3``, ``killed by
        SIGSEGV``): empty while it runs."""
        status = self.proc.returncode if self.proc is not None else None
        if status is None:
            return ""
        if status >= 0:
            return f"exit status {status}"
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"

    async def stop(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        if self.alive:
            stopped = self._expect(Stopped)
            with contextlib.suppress(Exception):
                self._send(Stop())
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            with contextlib.suppress(TimeoutError, ChildGone):
                event = await asyncio.wait_for(stopped, timeout_s)
                self.report, self.counts = event.report, dict(event.counts)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            log.error("process #%d did not exit in %.0fs; killing it", self.number, timeout_s)
            self.proc.kill()
            await self.proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(Exception):
                await self._reader_task
        self.alive = False
