"""The child side of ``conveyor worker --processes``: a daemon whose queues a supervisor hands out.

The supervisor is the only coordinator, so no two children ever own a queue at once:
it moves a queue by asking its owner to *release* it (the owner drains it: in-flight
messages finish and are acknowledged, the receiver shuts down) and only then asking
another child to *acquire* it. The messages are those of
:mod:`conveyor.workers.supervisor.protocol`: commands on stdin, events on the file
descriptor given as ``EVENTS_FD``. A child whose supervisor is gone (its events can no
longer be written) stops as told by the end of its stdin, quietly.

Run as ``python -m conveyor.workers.supervisor.child APP_PATH CONFIG_PATH EVENTS_FD
[CONFIG_FD]``: with ``CONFIG_FD`` the config is the text read from that descriptor (the
supervisor's bytes of the file), ``CONFIG_PATH`` naming it in errors only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from conveyor.backends import coordination
from conveyor.platform.balancing.balancer import BalanceListener, DynamicBalancer, QueueBalancer
from conveyor.platform.balancing.leases import LeaseStore, MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo, Membership
from conveyor.platform.config import Config
from conveyor.platform.errors import (
    BrokerError,
    ConfigError,
    ConveyorError,
    ShutdownError,
    error_text,
)
from conveyor.platform.terminal import VisibleFormatter, kept
from conveyor.workers.supervisor.protocol import (
    BEAT_S,
    CONFIG_REFUSED,
    LOG_LEVEL_ENV,
    Acquire,
    Acquired,
    Alive,
    Event,
    Failed,
    ProtocolError,
    Ready,
    Release,
    Released,
    Stop,
    Stopped,
    decode_command,
    encode,
)

log = logging.getLogger("conveyor.supervised")


class EventChannel:
    """The child's end of its event channel: writes events to the supervisor.

    When the supervisor is gone (its end is closed: the write fails with
    ``BrokenPipeError``) the event is dropped, and so is every later one: nobody is
    left to read them, and the child is stopping anyway — its stdin ended with the
    supervisor, which is a stop.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.supervisor_gone = False
        self._lock = threading.Lock()  # the beat thread writes too: one line at a time
        # A process a handler forks (os.fork, multiprocessing's default on Linux) would
        # hold the channel open after this one died: the supervisor would take it for
        # alive, and its queues would wait, for as long as that process lives.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a process forked from this one: not the supervisor's child; no events."""
        self._lock = threading.Lock()  # (held by the beat thread, maybe, at the fork)
        self.supervisor_gone = True
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def send(self, event: Event) -> None:
        with self._lock:
            if self.supervisor_gone:
                return
            try:
                os.write(self.fd, encode(event))
            except BrokenPipeError:
                self.supervisor_gone = True
                log.info("the supervisor is gone; stopping without reporting to it")

    def beat(self) -> None:
        """Send :class:`Alive` every :data:`BEAT_S` from a daemon thread, so that the
        supervisor can tell a stopped or hung process from a busy one."""

        def beats() -> None:
            while not self.supervisor_gone:
                self.send(Alive())
                time.sleep(BEAT_S)

        threading.Thread(target=beats, name="conveyor-supervisor-beat", daemon=True).start()


class SupervisedBalancer(QueueBalancer):
    """Owns exactly the queues the supervisor assigned; leases are the supervisor's."""

    def __init__(self) -> None:
        self._listener: BalanceListener | None = None
        self._owned: set[int] = set()

    async def start(self, member: MemberInfo, listener: BalanceListener) -> None:
        self._listener = listener

    async def acquire(self, queue: int) -> None:
        assert self._listener is not None
        if queue not in self._owned:
            self._owned.add(queue)
            await self._listener.queue_acquired(queue, None)

    async def release(self, queue: int) -> None:
        assert self._listener is not None
        if queue in self._owned:
            self._owned.discard(queue)
            await self._listener.queue_released(queue)

    async def stop(self) -> None:
        if self._listener is not None:
            await asyncio.gather(*(self.release(q) for q in sorted(self._owned)))
            self._listener = None

    def owned(self) -> list[int]:
        return sorted(self._owned)


class LeasedSupervisedBalancer(DynamicBalancer):
    """The supervisor's assignment, held as real leases of the app's shared lease store.

    Used when ``[balancer] membership`` names a store shared by processes (``redis``):
    children register as members (``conveyor status`` lists them and their queues),
    every queue they pull is fenced by its lease, a queue is given up drained *then*
    its lease released, and a queue whose previous owner crashed is taken over as soon
    as that owner's lease lapses. Only the target set differs from
    :class:`DynamicBalancer`: it is what the supervisor assigned, not a share computed
    from the membership.
    """

    def __init__(self, membership: Membership, leases: LeaseStore, total_queues: int,
                 **kw: Any) -> None:
        super().__init__(membership, leases, total_queues, **kw)
        self._assigned: set[int] = set()

    async def _rebalance(self) -> None:
        assert self._member is not None
        me = self._member.id
        if me not in [m.id for m in await self.membership.members()]:
            await self.membership.join(self._member)
        self._joined = True
        held = set(self._held)
        await self._move(give=held - self._assigned, take=self._assigned - held)

    async def acquire(self, queue: int) -> None:
        """Returns once the lease is held and the queue is being pulled."""
        self._assigned.add(queue)
        try:
            while queue not in self._held and queue in self._assigned and not self._stopping:
                await self._take(queue)
                if queue in self._held:
                    break
                if queue in self._failed_starts:
                    # _take released it after the start failed (logged there); waiting
                    # here would leave the supervisor waiting with it, so report it.
                    raise BrokerError(f"queue {queue}: starting it failed (see the log)")
                # A crashed owner's lease has not lapsed yet.
                await self.leases.wait_released(self.rebalance_interval_s)
            if self._stopping and queue not in self._held:
                raise ShutdownError(f"queue {queue}: not acquired, this process is stopping")
        except Exception:
            self._assigned.discard(queue)  # not ours after all: the supervisor re-assigns
            with contextlib.suppress(Exception):
                await self._give_up(queue)
            raise

    async def release(self, queue: int) -> None:
        self._assigned.discard(queue)
        await self._give_up(queue)


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _balancer_for(config: Config, app_name: str) -> SupervisedBalancer | LeasedSupervisedBalancer:
    membership, leases = coordination(config, app_name)
    if isinstance(leases, MemoryLeaseStore):  # in this process: nothing shared to lease in
        return SupervisedBalancer()
    return LeasedSupervisedBalancer(
        membership, leases, config.queues.total,
        lease_ttl_s=config.balancer.lease_ttl_s,
        rebalance_interval_s=config.balancer.rebalance_interval_s,
    )


def _command_loop(
    balancer: SupervisedBalancer | LeasedSupervisedBalancer,
    events: EventChannel,
    lines: Callable[[], Awaitable[asyncio.StreamReader]] = _stdin_lines,
) -> Callable[[], Awaitable[None]]:
    """The supervisor's commands, read from ``lines()`` (stdin): returns on :class:`Stop`
    or end of input. A line that is not a command is logged and skipped.

    Returning or cancelled (a SIGTERM), it first waits for the queue moves it started:
    a move is never cut short, and the daemon stops only after them.
    """

    async def move(command: Acquire | Release) -> None:
        acquiring, queue = isinstance(command, Acquire), command.queue
        try:
            await (balancer.acquire if acquiring else balancer.release)(queue)
        except Exception as exc:  # the supervisor must hear of it, or it waits forever
            op: Literal["acquire", "release"] = "acquire" if acquiring else "release"
            log.error("could not %s queue %d: %s", op, queue, exc)
            events.send(Failed(op, queue, error_text(exc)))
        else:
            events.send(Acquired(queue) if acquiring else Released(queue))

    async def commands() -> None:
        moves: set[asyncio.Task[None]] = set()
        reader = await lines()
        try:
            while line := await reader.readline():
                try:
                    command = decode_command(line)
                except ProtocolError as exc:  # a newer or broken supervisor: read on
                    log.warning("%s; ignored", exc)
                    continue
                if isinstance(command, Stop):
                    return
                task = asyncio.create_task(move(command))
                moves.add(task)
                task.add_done_callback(moves.discard)
        finally:
            while moves:  # asyncio.wait, unlike gather, never cancels what it waits for
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait(set(moves))

    return commands


async def run_child(app_path: str, config_path: str, events_fd: int,
                    config_text: bytes | None = None) -> None:
    from conveyor.loader import load_app
    from conveyor.platform.config import load_config, parse_config
    from conveyor.workers.daemon import WorkerDaemon
    from conveyor.workers.http_endpoint import daemon_endpoint
    from conveyor.workers.serve import serve

    events = EventChannel(events_fd)
    events.beat()
    app = load_app(app_path)
    if config_text is not None:  # the supervisor's bytes of the file at config_path
        config = parse_config(config_text, config_path)
    else:
        config = load_config(None if config_path == "-" else config_path)
    balancer = _balancer_for(config, app.name)
    daemon = WorkerDaemon(app, config, balancer=balancer)
    # [http] port is the supervisor's: a child serves on a loopback port of the kernel's
    # choosing, which the supervisor scrapes (conveyor.workers.supervisor.endpoint).
    endpoint = daemon_endpoint(daemon, "127.0.0.1", 0) if config.http.port is not None else None
    # SIGINT stays ignored (see main): the supervisor decides when children stop.
    report = await serve(
        daemon,
        ready=lambda: events.send(Ready(
            daemon.member.id, os.getpid(), endpoint.port if endpoint is not None else None
        )),
        commands=_command_loop(balancer, events),
        signals=(signal.SIGTERM,),
        endpoint=endpoint,
    )
    events.send(Stopped(str(report), dataclasses.asdict(report)))


def main(argv: list[str] | None = None) -> None:
    from conveyor.workers.serve import leave_running_threads, run_served, stopped_status

    app_path, config_path, events_fd, *config_fd = (argv or sys.argv[1:])[:4]
    # The supervisor decides when children stop (a Ctrl-C on the terminal reaches it);
    # a SIGTERM sent to a child directly drains it like a "stop" command.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handler = logging.StreamHandler(kept(sys.stderr))  # producers' text escaped, as the CLI's
    handler.setFormatter(VisibleFormatter(
        f"%(asctime)s %(levelname)s [child {os.getpid()}] %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get(LOG_LEVEL_ENV, "INFO"), handlers=[handler])
    config_text = None
    if config_fd:
        with open(int(config_fd[0]), "rb") as file:
            config_text = file.read()
    try:
        run_served(lambda: run_child(app_path, config_path, int(events_fd), config_text))
    except ConveyorError as exc:  # a message for the operator, not a traceback
        log.error("%s", exc)
        status = CONFIG_REFUSED if isinstance(exc, ConfigError) else 1
        leave_running_threads(status)
        sys.exit(status)
    except (SystemExit, KeyboardInterrupt) as exc:  # a handler's or hook's, which the
        # agent logged: the exit status says it to the supervisor, without a traceback
        # and without waiting at exit for a thread the app started (its beats would go
        # on from their daemon thread: the supervisor would never replace this process)
        status = stopped_status(exc)
        leave_running_threads(status)
        sys.exit(status)
    leave_running_threads(0)


if __name__ == "__main__":
    main()
