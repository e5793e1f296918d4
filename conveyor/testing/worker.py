"""The :class:`TestWorker`: an app's real worker daemon on a private embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, NoReturn

import msgspec

from conveyor.adapters.memory import MemoryBroker, reset_broker
from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.platform.config import Config
from conveyor.platform.delivery.chain import STOPS, Delivery
from conveyor.platform.delivery.idempotency import LocalIdempotencyStore
from conveyor.platform.errors import ConveyorError, InvalidArgumentError
from conveyor.platform.ids import namespace_refusal, shown_any
from conveyor.platform.letters import StoredLetter
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.operations import dlq
from conveyor.platform.options import CellOptions, is_number
from conveyor.platform.telemetry import Telemetry
from conveyor.testing.observe import (
    BatchCall,
    Observations,
    ObservedAdapter,
    Stop,
    observed_app,
)
from conveyor.testing.records import (
    DeadLettersFound,
    NotSettled,
    Outcome,
    Record,
    StartupHookFailed,
    WorkerStopped,
    report,
    shown,
    trimmed,
)
from conveyor.workers.cells.interceptor import cell_reader
from conveyor.workers.daemon import HOOKS_GRACE_S, DrainReport, WorkerDaemon

HandlerRef = str | Callable[..., Any]
"""A handler, named as declared (``module.function`` or ``name=``), by its last part
(``"on_order"``), or given as the decorated function itself."""

_LISTED = 20
"""Unsettled messages a NotSettled error lists one by one (then it counts the rest)."""

STOP_GRACE_S = 2.0
"""How long past ``stop_timeout_s`` :meth:`TestWorker.stop` waits for the daemon's stop
before it gives up on it, saying why (a handler call that ignores its cancellation holds
it for ever)."""


HOOK_HELD = ("a hook that catches asyncio.CancelledError must raise it again; conveyor "
             f"worker's stop leaves it running after {HOOKS_GRACE_S:g}s")
"""What a stop that left a startup hook running says of it."""

NOT_STARTED = ("the TestWorker is not started: use `async with TestWorker(app) as worker` "
               "or `await worker.start()`")
"""What a call that needs the worker started says before the start."""


def kit_config(config: Config | None, broker_name: str) -> Config:
    """``config`` (or the defaults) on the private embedded broker ``broker_name``, with
    every queue owned by the one daemon, its ``[slots.rate]`` limit kept in the process
    (not shared through ``[redis] url``: the daemon is alone) and no HTTP endpoint; the
    rest as given. Nothing in it reaches a server."""
    base = config or Config()
    replace = msgspec.structs.replace
    return replace(
        base,
        queues=replace(base.queues, adapter="memory"),
        memory=replace(base.memory, broker=broker_name),
        balancer=replace(base.balancer, kind="static", queues=[]),
        slots=replace(base.slots, rate=replace(base.slots.rate, store="local")),
        http=replace(base.http, port=None),
    )


class TestWorker:
    """Runs ``app``'s handlers in this process, through the real daemon, pulling agents
    and delivery chain, on a private embedded broker. ::

        async with TestWorker(app) as worker:
            await worker.publish("orders", "o-1", {"total": 3})
            await worker.settle()
            assert worker.bodies("orders") == [Order(total=3)]

    ``config`` supplies everything but the broker (slots, cells, dead-letter policy,
    drain time); its ``[queues] adapter`` is replaced by a private embedded broker and
    its balancer by one that gives this daemon every queue. ``delay_scale`` multiplies
    the waits handlers declare — retry back-off (``retry_delay_s``, ``retry_max_delay_s``,
    ``retry_jitter_s``) and ``batch_wait_ms`` — 0 (the default) retries at once and cuts
    a batch from what has arrived, 1 keeps them as declared; the number of attempts never
    changes. ``telemetry`` is off unless given. The ``App`` object is not modified: the
    daemon runs a copy with one observer added (see :mod:`conveyor.testing.observe`).

    Leaving the ``async with`` block cleanly settles what was published since the test's
    last :meth:`settle` (and the startup hooks, if it never settled) and raises
    :class:`DeadLettersFound` for dead letters the test never looked at
    (:meth:`_check_at_exit`); :meth:`stop` does neither.
    """

    __test__ = False  # pytest: not a test class, whatever a test module imports

    def __init__(
        self,
        app: App,
        config: Config | None = None,
        *,
        delay_scale: float = 0.0,
        settle_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        if not isinstance(app, App):
            raise InvalidArgumentError(
                f"TestWorker(app): expected a conveyor.App, got {_kind(app)}")
        if config is not None and not isinstance(config, Config):
            raise InvalidArgumentError(
                f"TestWorker(app, config): expected a conveyor.Config (from "
                f"conveyor.load_config(...)) or None, got {_kind(config)}")
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise InvalidArgumentError(
                "TestWorker(telemetry=...): expected a conveyor.platform.telemetry.Telemetry "
                f"(Telemetry.from_config(config.telemetry)) or None, got {_kind(telemetry)}")
        for name, value in (("delay_scale", delay_scale), ("settle_timeout_s", settle_timeout_s),
                            ("stop_timeout_s", stop_timeout_s)):
            _check_seconds(f"TestWorker {name}", value)
        self.app = app
        self.delay_scale = float(delay_scale)
        self.settle_timeout_s = settle_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.broker_name = f"conveyor-testing-{uuid.uuid4().hex[:12]}"
        self.config = kit_config(config, self.broker_name)
        self._telemetry = telemetry or Telemetry.disabled()
        self._observations = Observations(app)
        self._settled = 0  # records already returned by settle()
        self._looked = 0
        """Records the test has seen: returned by settle(), or read through records,
        dead_lettered() or report(); dead letters past it fail a clean exit."""
        self._checked: int | None = None
        """Messages published (by anyone) when the test last called settle() or
        unsettled(), None before its first call: more at the exit (or a startup hook
        still running that no such call saw), and the exit settles them."""
        self._daemon: WorkerDaemon | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the daemon was started on, which runs it."""
        self.drain_report: DrainReport | None = None
        """What the daemon's stop did (set by :meth:`stop`)."""
        self._failure_watch: asyncio.Task[None] | None = None
        self._failure_said = False
        """A settle() raised the daemon's failure (``WorkerStopped``): the exit need not."""

    def __repr__(self) -> str:
        state = ("stopped" if self.drain_report is not None
                 else "started" if self._daemon is not None else "not started")
        return (f"TestWorker(app={self.app.name!r}, {state}, "
                f"settled={len(self._observations.records)})")

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> TestWorker:
        if self.drain_report is not None:
            raise ConveyorError("this TestWorker is stopped: a TestWorker starts once "
                                "(make a new one for a fresh broker)")
        if self._daemon is not None:
            raise ConveyorError("this TestWorker is started already")
        observations = self._observations
        adapter = ObservedAdapter(self.broker_name, observations,
                                  max_dead_letters=self.config.dead_letters.max_entries)
        shadow = observed_app(self.app, observations, self.delay_scale)
        self._loop = asyncio.get_running_loop()
        self.app.hold(self)  # its daemon runs the handlers of now: later ones are refused
        try:
            self._daemon = WorkerDaemon(shadow, self.config, adapter=adapter,
                                        telemetry=self._telemetry)
            await self._daemon.start()
            self._failure_watch = asyncio.create_task(
                self._wake_on_failure(self._daemon), name="conveyor-testing-failure")
        except BaseException:
            if self._daemon is not None:
                with contextlib.suppress(Exception):  # the start's error is the one to see
                    await self._daemon.stop(deadline=asyncio.get_running_loop().time())
            self._forget_broker()
            raise
        return self

    async def _wake_on_failure(self, daemon: WorkerDaemon) -> None:
        """Wake a waiting :meth:`settle` when the daemon fails: it answers at once."""
        await daemon.failed.wait()
        self._observations.changed.set()

    async def stop(self) -> DrainReport:
        """Drain the daemon (within ``stop_timeout_s``) and forget the private broker.

        A stop still under way :data:`STOP_GRACE_S` later — held by a handler call that
        caught its cancellation and went on — is left to end in the background (then
        ``drain_report`` is set) and a :class:`ConveyorError` names the calls. A startup
        hook that caught its cancellation and went on does not hold the stop (the
        daemon's goes on without it, as ``conveyor worker``'s does), but a
        :class:`ConveyorError` names it once the stop is done: it runs on."""
        __tracebackhide__ = True
        daemon = self.daemon
        loop = asyncio.get_running_loop()
        self._observations.stopping = True
        if self._failure_watch is not None:
            self._failure_watch.cancel()
        # A handler raised KeyboardInterrupt or SystemExit: conveyor worker stops at
        # once then, without draining (the held call would only run out the drain).
        drain_s = 0.0 if self._observations.stops else self.stop_timeout_s
        stopping = asyncio.ensure_future(daemon.stop(deadline=loop.time() + drain_s))
        try:
            await asyncio.wait({stopping}, timeout=self.stop_timeout_s + STOP_GRACE_S)
        except BaseException:
            stopping.cancel()
            self._forget_broker()
            raise
        self._forget_broker()
        if not stopping.done():
            stopping.add_done_callback(self._stopped_late)
            raise ConveyorError(self._stop_stuck())
        self.drain_report = stopping.result()
        hooks = ", ".join(run.name for run in self._observations.hooks if run.running)
        if hooks:  # the daemon's stop went on without it: it runs on in this loop
            raise ConveyorError(f"the stop left startup hook(s) still running after their "
                                f"cancellation: {hooks} — {HOOK_HELD}")
        return self.drain_report

    def _stopped_late(self, stopping: asyncio.Future[DrainReport]) -> None:
        if not stopping.cancelled() and stopping.exception() is None:
            self.drain_report = stopping.result()

    def _stop_stuck(self) -> str:
        """Why the daemon's stop does not end, as far as the kit saw."""
        observations = self._observations

        def calls(found: Iterable[tuple[int, int, str]]) -> str:
            return ", ".join(f"{name.rpartition('.')[2]} on {_named(observations.messages[(q, o)])}"
                             for q, o, name in found if (q, o) in observations.messages)

        held = [f"{how}: {named}" for how, named in (
            ("handler call(s) that caught their cancellation and went on",
             calls(observations.swallowed)),
            ("handler call(s) still running after their cancellation",
             calls(observations.running))) if named]
        hooks = ", ".join(run.name for run in observations.hooks if run.running)
        why = "; ".join(filter(None, [
            ("; ".join(held) + " — a handler that catches asyncio.CancelledError (a bare "
             "except:, except BaseException) must raise it again; conveyor worker "
             "abandons such a call at drain_timeout_s + 3s and leaves without it, its "
             "message unacknowledged") if held else "",
            (f"startup hook(s) still running after their cancellation: {hooks} — "
             f"{HOOK_HELD}") if hooks else "",
        ])) or "nothing the kit can name holds it"
        return (f"the stop did not end within stop_timeout_s + {STOP_GRACE_S:g}s: {why}; "
                "it goes on in the background")

    def _forget_broker(self) -> None:
        """Forget the private broker, and let the app take handlers again (the daemon
        that ran them is stopped, or never started)."""
        self.app.release(self)
        reset_broker(self.broker_name)
        # The embedded idempotency store lives per broker name, for the process.
        LocalIdempotencyStore._by_broker.pop(self.broker_name, None)

    async def __aenter__(self) -> TestWorker:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        """Stop; when the block ended cleanly, first settle what was published since the
        test's last settle, and fail on what nobody saw (:meth:`_check_at_exit`)."""
        __tracebackhide__ = True
        try:
            if exc_type is None and self._daemon is not None and self.drain_report is None:
                await self._check_at_exit()
        finally:
            await self.stop()

    async def _check_at_exit(self) -> None:
        """A test that publishes and ends without ``settle()`` would pass over a failing
        handler or startup hook. So what was published since its last ``settle()`` — by
        the test, ``worker.client``, a handler or a hook — is settled here, with the
        startup hooks if no ``settle()`` saw them (``NotSettled`` past the timeout);
        then a hook's failure is raised, a worker that stopped on its own (a handler's
        ``KeyboardInterrupt`` or ``SystemExit``, the daemon's failure) that no
        ``settle()`` raised raises :class:`WorkerStopped` — the daemon may fail after the
        test's last ``settle()``, with nothing published since — and a dead letter the
        test never saw (no ``settle()`` returned it, nor did ``records``,
        ``dead_lettered()`` or ``report()``) raises :class:`DeadLettersFound`."""
        __tracebackhide__ = True
        looked = self._looked
        observations = self._observations
        hooks_unseen = self._checked is None and any(run.running for run in observations.hooks)
        if len(observations.messages) > (self._checked or 0) or hooks_unseen:
            await self.settle(raise_on_dead_letters=False)
        self._raise_hook_failures()
        failure = self.daemon.failure
        if any(not stop.reported for stop in observations.stops) or (
                failure is not None and not self._failure_said):
            self._raise_stops()
        letters = [r for r in self._observations.sorted_records(looked)
                   if r.outcome is Outcome.DEAD_LETTERED]
        if letters:
            _dead_letters_found(letters, "that the test never looked at (it ended without "
                                "a settle() that reported them; settle(raise_on_dead_"
                                "letters=False) and dead_lettered() if it expects them)")

    @property
    def daemon(self) -> WorkerDaemon:
        """The real :class:`~conveyor.WorkerDaemon` under test (pools, cells, stats)."""
        if self._daemon is None:
            raise ConveyorError(NOT_STARTED)
        return self._daemon

    def _running(self, doing: str) -> WorkerDaemon:
        """The daemon, for something that needs it running (``doing``): refused, in one
        line, before the start and after the stop (nothing would handle a message)."""
        __tracebackhide__ = True
        if self.drain_report is not None:
            raise ConveyorError(f"cannot {doing}: this TestWorker is stopped (its records "
                                "are still readable)")
        daemon = self.daemon
        self._check_loop(doing)
        return daemon

    def _check_loop(self, doing: str) -> None:
        """Refuse, in one line, a call from another event loop than the daemon's: that
        loop stands still while this one waits, so nothing would be pulled or handled."""
        __tracebackhide__ = True
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise ConveyorError(
                f"cannot {doing}: this TestWorker was started on another event loop, which "
                "runs its daemon and stands still while this one waits. Either the "
                "fixture and the test run on loops of different scopes (pytest-asyncio: "
                "give them the same, e.g. asyncio_default_fixture_loop_scope as "
                "asyncio_default_test_loop_scope); or an anyio test (@pytest.mark.anyio) "
                "given a fixture pytest-asyncio ran, as its asyncio_mode = auto runs every "
                "async fixture (use its strict mode, or mark the test asyncio); or a plain "
                "def test cannot drive it (asyncio.run runs another loop): make the test "
                "async def")

    @property
    def client(self) -> Client:
        """The client startup hooks receive: publishing with it is publishing here."""
        return self.daemon.client

    # -- publishing --------------------------------------------------------------------------
    async def publish(self, namespace: str, key: str, body: Any,
                      headers: dict[str, str] | None = None,
                      content_type: str | None = None) -> Message:
        """Publish one message (as :meth:`conveyor.Client.publish` does); returns it as
        stored, with its id and position."""
        __tracebackhide__ = True
        client = self._running("publish").client
        token = await client.publish(namespace, key, body, headers, content_type)
        return self._stored(token.queue, token.major)

    async def publish_batch(self, items: Iterable[Publish]) -> list[Message]:
        """Publish many messages at once (as :meth:`conveyor.Client.publish_batch`)."""
        __tracebackhide__ = True
        client = self._running("publish").client
        _check_listed(items, Publish, "publish_batch: expected a list of conveyor.Publish items")
        batch = list(items)
        for item in batch:
            if not isinstance(item, Publish):
                raise InvalidArgumentError(
                    f"publish_batch: expected conveyor.Publish items, got {_kind(item)}")
        tokens = await client.publish_batch(batch)
        return [self._stored(t.queue, t.major) for t in tokens]

    async def redeliver(self, message: Message) -> Message:
        """Deliver ``message`` again, same id and all, as a crash or a lost lease would
        (what an ``idempotent=True`` handler must absorb): its ``deliveries`` one more, as
        a broker that counts them hands it back (so ``max_deliveries`` applies). Returns
        the new copy."""
        __tracebackhide__ = True
        daemon = self._running("redeliver")
        if not isinstance(message, Message):
            raise InvalidArgumentError(
                f"redeliver: expected a Message (as publish() or published() returns it), "
                f"got {_kind(message)}")
        queue = daemon.client.queue_for(message.stream.namespace, message.stream.key)
        plain = msgspec.structs.replace(message, token=None,
                                        deliveries=message.deliveries + 1)
        token = (await daemon.adapter.enqueue(queue, [plain]))[0]
        return self._stored(token.queue, token.major)

    async def replay(self, records: Iterable[Record] | None = None) -> list[Message]:
        """Replay dead letters as ``conveyor dlq replay`` does — each letter's message
        published again to its stream (same id, header ``cv-replay-of``), the letter
        removed — those of ``records`` (dead-lettered records), or every letter stored
        when it is called. Returns the messages published, in the letters' order.

        Nothing is replayed when a letter cannot be, or (``records``) is not stored: the
        letters are looked at first, then replayed, each time read a page at a time as
        ``conveyor dlq replay --all`` reads them (:func:`conveyor.platform.operations.dlq.
        letters`), never all held at once."""
        __tracebackhide__ = True
        daemon = self._running("replay")
        if records is not None:
            _check_listed(records, Record, "replay: expected a list of records of worker."
                          "dead_lettered() (or None: every letter stored)")
        adapter, group = daemon.adapter, self.app.name
        until = await adapter.dead_letters.mark(group)  # a letter stored later is not taken
        chosen = None if records is None else list(records)
        wanted = None if chosen is None else [_dead_lettered(record) for record in chosen]

        def keep(stored: StoredLetter) -> bool:
            return wanted is None or stored.letter in wanted

        def stored() -> dlq.Letters:
            return [] if until is None else dlq.letters(adapter, group, keep, until=until)

        if chosen is not None:
            letters = [s.letter async for s in dlq.each(stored())]
            gone = [_named(r.message) for r in chosen if r.letter not in letters]
            if gone:  # as `conveyor dlq replay --id` refuses an id not stored
                raise InvalidArgumentError(
                    f"replay: no dead letter stored for {', '.join(dict.fromkeys(gone))} "
                    "(replayed already, evicted past [dead_letters] max_entries, or a "
                    "record of another TestWorker); nothing was replayed")
        refused = [f"letter {s.id} ({s.letter.message.id[-8:]}): {why}"
                   async for s in dlq.each(stored()) if (why := dlq.not_replayable(s))]
        if refused:
            raise InvalidArgumentError(f"replay: cannot replay {'; '.join(refused)} "
                                       "(nothing was replayed)")
        done = await dlq.replay(adapter, daemon.mapper, group, stored())
        return [self._stored(token.queue, token.major) for _, token in done.replayed]

    def _stored(self, queue: int, offset: int) -> Message:
        return self._observations.messages[(queue, offset)]

    def _broker(self) -> MemoryBroker:
        broker = self._observations.broker
        if broker is None:
            raise ConveyorError(NOT_STARTED)
        return broker

    # -- settling ----------------------------------------------------------------------------
    async def settle(self, timeout_s: float | None = None, *,
                     raise_on_dead_letters: bool = True) -> list[Record]:
        """Wait until every message published so far — and every message their handlers
        and the startup hooks publish meanwhile — is acknowledged: handled, dead-lettered
        or skipped, retries included; and until the startup hooks have returned.

        Returns the records settled since the previous call. Raises :class:`NotSettled`
        after ``timeout_s`` (default ``settle_timeout_s``) naming what is not settled,
        :class:`StartupHookFailed` if a startup hook raised, and (unless
        ``raise_on_dead_letters=False``) :class:`DeadLettersFound` if any message was
        dead-lettered, with the first failure's exception as the cause.
        """
        __tracebackhide__ = True  # pytest: the failure is the test's, not this frame's
        timeout = self.settle_timeout_s if timeout_s is None else timeout_s
        _check_seconds("settle timeout_s", timeout)
        self._check_loop("settle")
        if self.drain_report is not None and not self._quiet():
            raise NotSettled("cannot settle: this TestWorker is stopped, and nothing will "
                             "handle what is left:\n" + "\n".join(self.unsettled()))
        changed = self._observations.changed
        try:
            async with asyncio.timeout(timeout):
                while not self._quiet() and not self._stopped():
                    changed.clear()
                    await changed.wait()
        except TimeoutError:
            if not self._quiet() and not self._stopped():
                self._not_settled(timeout)
        finally:
            self._checked = len(self._observations.messages)
            # Settled after all: the deadline passed while a handler blocked the event
            # loop, and what it held was acknowledged as the loop ran again.
        self._raise_hook_failures()
        self._raise_stops()
        new = self._observations.sorted_records(self._settled)
        self._settled = self._looked = len(self._observations.records)
        letters = [r for r in new if r.outcome is Outcome.DEAD_LETTERED]
        if letters and raise_on_dead_letters:
            _dead_letters_found(letters, "(settle(raise_on_dead_letters=False) if the test "
                                "expects that)")
        return new

    def _not_settled(self, timeout: float) -> NoReturn:
        __tracebackhide__ = True
        failure = self._daemon.failure if self._daemon is not None else None
        said = [] if failure is None else [f"the daemon failed: {failure}"]
        observations = self._observations
        published = len(observations.messages)
        settled = published - len(observations.published)
        raise NotSettled(
            f"not settled after {timeout:g}s ({published} message{'s' * (published != 1)} "
            f"published, {settled} settled):\n" + "\n".join([*said, *self.unsettled()])
        ) from failure

    def _quiet(self) -> bool:
        observations = self._observations
        if any(run.running for run in observations.hooks):
            return False
        broker = self._broker()
        group = self.app.name
        for queue, log in broker.logs.items():
            cursor = broker.cursors.get((group, queue))
            if cursor is None:
                if log.items:
                    return False
                continue
            if cursor.next_offset < log.end or cursor.pending or cursor.redeliver:
                return False
        return True

    def unsettled(self) -> list[str]:
        """What :meth:`settle` is waiting for, one line each (empty when settled)."""
        self._checked = len(self._observations.messages)
        observations = self._observations
        lines = [f"startup hook {run.name} still running"
                 for run in observations.hooks if run.running]
        broker = self._broker()
        group = self.app.name
        waiting: list[str] = []
        busy = {(q, o) for q, o, _ in observations.running}
        busy.update(stop.call[:2] for stop in observations.stops)
        first: list[int] = []  # waiting's lines of messages a call runs on: listed first
        for queue, log in sorted(broker.logs.items()):
            cursor = broker.cursors.get((group, queue))
            start = log.base if cursor is None else cursor.next_offset
            held: list[tuple[int, Message]] = []
            back: set[int] = set()
            if cursor is not None:
                held.extend(cursor.pending.items())
                for message in cursor.redeliver:
                    offset = message.token.major if message.token else -1
                    held.append((offset, message))
                    back.add(offset)
            held.sort(key=lambda t: t[0])
            for index, (offset, message) in enumerate(held):
                state = ("handed back, to be delivered again" if offset in back
                         else self._held_state(queue, offset, message, held[:index]))
                if (queue, offset) in busy:
                    first.append(len(waiting))
                waiting.append(f"queue {queue}: {_named(message)}: {state}")
            for message in log.items[start - log.base:]:
                waiting.append(f"queue {queue}: {_named(message)}: not pulled yet"
                               + (" (no receiver for this app)" if cursor is None else ""))
        for name, count in sorted(observations.batches_running.items()):
            if count:
                lines.append(f"batch handler {name.rpartition('.')[2]}: a batch is running")
        if len(waiting) > _LISTED:  # the messages calls run on, then the first others
            chosen = set(first[:_LISTED])
            for index in range(len(waiting)):
                if len(chosen) == _LISTED:
                    break
                chosen.add(index)
            lines.extend(line for i, line in enumerate(waiting) if i in chosen)
        else:
            lines.extend(waiting)
        if len(waiting) > _LISTED:
            lines.append(f"... and {len(waiting) - _LISTED} more message(s)")
        return lines

    def _held_state(self, queue: int, offset: int, message: Message,
                    earlier: list[tuple[int, Message]]) -> str:
        """What a message the daemon pulled and has not acknowledged waits for;
        ``earlier``: the messages of its queue held before it, in queue order."""
        observations = self._observations
        calls = observations.running_calls((queue, offset), self._queued_in)
        calls += [f"{stop.call[2].rpartition('.')[2]} raised {_raised(stop.error)}: held (a worker "
                  "stops there)" for stop in observations.stops
                  if stop.call[:2] == (queue, offset)]
        if calls:
            return "; ".join(calls)
        ahead = next((m for _, m in earlier if m.stream == message.stream), None)
        if ahead is not None:
            return f"waiting for message {ahead.id[-8:]} of its stream (handled in order)"
        ended = 0
        specs = observations.specs.get(message.stream.namespace, ())
        for spec in specs:
            call = (queue, offset, spec.name)
            tries = observations.attempts.get(call, [])
            if call in observations.letters or (tries and tries[-1].error is None):
                ended += 1
            elif tries and (error := tries[-1].error) is not None:
                return (f"{spec.name.rpartition('.')[2]} attempt {tries[-1].number} failed "
                        f"({type(error).__name__}: {error}); the next waits its back-off")
        if specs and ended == len(specs):
            if earlier:
                return (f"done; its acknowledgement waits for message "
                        f"{earlier[0][1].id[-8:]}, earlier in the queue (acknowledged in "
                        "queue order)")
            return "done; being acknowledged"
        return "pulled, not started (waiting for a slot, or for its batch)"

    def _queued_in(self, handler: str, delivery: Delivery) -> tuple[str, str] | None:
        """Where a call of ``handler`` may wait before it runs — its pool, or its cell —
        and that place's load; None for a handler with neither (it runs at once)."""
        daemon = self.daemon
        pool = daemon.pools.get(handler)
        if pool is not None:
            busy = pool.size - pool.idle_workers
            return "in its pool", _load(busy, pool.max_workers, pool.waiting - busy)
        router = daemon.cells.get(handler)
        options = next((spec.option(CellOptions) for spec in self.app.handlers
                        if spec.name == handler), None)
        if router is None or options is None:
            return None
        name = cell_reader(options)(delivery)
        cell = router.cells.get(name)
        if cell is None:
            return None
        return f"in cell {shown(name)!r}", _load(cell.busy, cell.size, cell.queue_length)

    def _hook_stops(self) -> list[tuple[str, BaseException]]:
        """The startup hooks that raised ``KeyboardInterrupt`` or ``SystemExit``, and
        what they raised."""
        return [(run.name, run.error) for run in self._observations.hooks
                if run.error is not None and not isinstance(run.error, Exception)]

    def _stopped(self) -> bool:
        """A handler call or a startup hook stopped the worker, or the daemon failed:
        ``conveyor worker`` is gone, so nothing is to be waited for."""
        return bool(self._observations.stops or self._hook_stops()) or (
            self._daemon is not None and self._daemon.failure is not None)

    def _raise_stops(self) -> None:
        """Raise :class:`WorkerStopped` when the worker stopped: for the handler calls
        that raised ``KeyboardInterrupt`` or ``SystemExit`` since the last time (named
        once each; pytest's outcome of the test, one raised, is raised itself), else for
        the daemon's failure, else, again, for the first stop (a startup hook's was
        raised as :class:`StartupHookFailed` the first time)."""
        __tracebackhide__ = True
        stops = self._observations.stops
        new = [stop for stop in stops if not stop.reported]
        if new:
            for stop in new:
                stop.reported = True
            for stop in new:  # pytest's outcome, raised in a handler: the test's
                if not isinstance(stop.error, STOPS):
                    raise stop.error
            raise WorkerStopped(
                f"{'; '.join(map(self._stop_named, new))}: conveyor worker stops at once "
                "there, without draining (its message comes back, redelivered, to the next "
                "worker); the kit holds the call instead, its message unacknowledged, until "
                "the worker stops") from trimmed(new[0].error)
        failure = self._daemon.failure if self._daemon is not None else None
        if failure is not None:
            self._failure_said = True
            raise WorkerStopped(
                f"the worker failed: {failure} (conveyor worker stops there and exits 1; "
                "every later settle() says so)") from trimmed(failure)
        hooks = self._hook_stops()
        if hooks or stops:  # raised once already (StartupHookFailed, WorkerStopped)
            hook, error = hooks[0] if hooks else ("", stops[0].error)
            said = (f"startup hook {hook} raised {_raised(error)}" if hooks
                    else self._stop_named(stops[0]))
            raise WorkerStopped(
                f"this TestWorker's worker stopped earlier: {said}: conveyor worker handles "
                "nothing after that (worker.unsettled() names what is left; a new "
                "TestWorker starts afresh)") from trimmed(error)

    def _stop_named(self, stop: Stop) -> str:
        queue, offset, handler = stop.call
        message = self._observations.messages.get((queue, offset))
        where = _named(message) if message is not None else "a message"
        return f"handler {handler.rpartition('.')[2]} raised {_raised(stop.error)} on {where}"

    def _raise_hook_failures(self) -> None:
        __tracebackhide__ = True
        for run in self._observations.hooks:
            if run.error is not None and not run.reported:
                run.reported = True
                if not isinstance(run.error, (Exception, *STOPS)):
                    raise run.error  # pytest's outcome of the test (observe.held)
                stop = ("" if isinstance(run.error, Exception) else
                        " (which stops conveyor worker at once: a later settle() raises "
                        "WorkerStopped)")
                raise StartupHookFailed(
                    f"startup hook {run.name} raised {type(run.error).__name__}: "
                    f"{run.error}{stop}") from trimmed(run.error)

    # -- what happened -----------------------------------------------------------------------
    @property
    def records(self) -> list[Record]:
        """Every settled message, per handler, in publish order (then declaration order).
        Refused before the start (:meth:`_read`), as every read of what happened is."""
        self._read()
        self._looked = len(self._observations.records)
        return self._observations.sorted_records()

    def _read(self) -> None:
        """Refuse to read what happened before the start: nothing could have, and an
        empty list would pass a test's ``assert not worker.dead_lettered()`` over a
        worker that never ran (a fixture that forgot to start it). Once stopped, the
        records stay readable."""
        __tracebackhide__ = True
        if self._daemon is None:
            raise ConveyorError(NOT_STARTED)

    def _select(self, outcome: Outcome | None, namespace: str | None,
                handler: HandlerRef | None, call: str) -> list[Record]:
        self._read()
        unroutable_kept = self.config.dead_letters.unroutable == "dead-letter"
        handled = (None if outcome is Outcome.DEAD_LETTERED and unroutable_kept
                   else outcome is not Outcome.SKIPPED)
        self._check_namespace(call, namespace, handled=handled)
        match = self._handler_match(handler)
        return [
            r for r in self._observations.sorted_records()
            if (outcome is None or r.outcome is outcome)
            and (namespace is None or r.namespace == namespace)
            and match(r.handler)
        ]

    def _check_namespace(self, call: str, namespace: object, *,
                         handled: bool | None) -> None:
        """Refuse, naming ``call``, a ``namespace`` filter that can match nothing: not a
        namespace at all; with ``handled``, one no handler of the app takes (a typo);
        with ``handled=False`` (skipped), one a handler takes. (None: any namespace, for
        what is published, and for dead letters when ``[dead_letters] unroutable =
        "dead-letter"`` keeps those of namespaces no handler takes.)"""
        __tracebackhide__ = True
        if namespace is None:
            return
        problem = namespace_refusal(namespace)
        said = f"{call}(namespace={shown_any(namespace)})"
        if problem is not None:
            raise InvalidArgumentError(f"{said}: the namespace {problem}")
        assert isinstance(namespace, str)
        taken = namespace in self._observations.specs
        if handled and not taken:
            raise InvalidArgumentError(
                f"{said}: no handler of app {self.app.name!r} takes that namespace (its "
                f"namespaces: {', '.join(map(shown, self._observations.specs)) or 'none'})")
        if handled is False and taken:
            raise InvalidArgumentError(
                f"{said}: app {self.app.name!r} has handlers of that namespace, so its "
                "messages are never skipped")

    def _handler_match(self, handler: HandlerRef | None) -> Callable[[str], bool]:
        if handler is None:
            return lambda name: True
        if not isinstance(handler, str):
            # ==, not is: a bound method is a new object at each attribute access
            names = {spec.name for spec in self.app.handlers if spec.fn == handler}
            if not names:
                raise InvalidArgumentError(f"{handler!r} is not a handler of app "
                                           f"{self.app.name!r}")
            return names.__contains__
        names = {spec.name for spec in self.app.handlers
                 if handler in (spec.name, spec.name.rpartition(".")[2])}
        if not names:
            declared = ", ".join(sorted(spec.name.rpartition(".")[2]
                                        for spec in self.app.handlers)) or "none"
            raise InvalidArgumentError(
                f"{handler!r} is not a handler of app {self.app.name!r} (its handlers: "
                f"{declared})")
        return names.__contains__

    def handled(self, namespace: str | None = None, *,
                handler: HandlerRef | None = None) -> list[Record]:
        """Records of messages a handler returned on (after retries or not)."""
        return self._select(Outcome.HANDLED, namespace, handler, "handled")

    def dead_lettered(self, namespace: str | None = None, *,
                      handler: HandlerRef | None = None) -> list[Record]:
        """Records of messages stored as dead letters (``record.letter`` says why)."""
        self._looked = len(self._observations.records)
        return self._select(Outcome.DEAD_LETTERED, namespace, handler, "dead_lettered")

    def retried(self, namespace: str | None = None, *,
                handler: HandlerRef | None = None) -> list[Record]:
        """Records of messages a handler was called on more than once."""
        return [r for r in self._select(None, namespace, handler, "retried") if r.retried]

    def skipped(self, namespace: str | None = None) -> list[Record]:
        """Records of messages of namespaces no handler of the app subscribes to."""
        return self._select(Outcome.SKIPPED, namespace, None, "skipped")

    def deduplicated(self, namespace: str | None = None, *,
                     handler: HandlerRef | None = None) -> list[Record]:
        """Records of deliveries an ``idempotent=True`` handler had completed already."""
        return self._select(Outcome.DEDUPLICATED, namespace, handler, "deduplicated")

    def bodies(self, namespace: str | None = None, *,
               handler: HandlerRef | None = None) -> list[Any]:
        """The bodies handled, as the handler received them, in publish order."""
        return [r.body for r in self._select(Outcome.HANDLED, namespace, handler, "bodies")]

    def published(self, namespace: str | None = None) -> list[Message]:
        """Every message published (by the test, the handlers or the startup hooks), in
        the order published, as stored (with its position)."""
        self._check_namespace("published", namespace, handled=None)
        self._broker()
        return [m for m in self._observations.messages.values()
                if namespace is None or m.stream.namespace == namespace]

    def batches(self, handler: HandlerRef | None = None) -> list[BatchCall]:
        """Every call of a batch handler, in the order they ended."""
        self._read()
        match = self._handler_match(handler)
        return [call for call in self._observations.batches if match(call.handler)]

    def report(self, *, tracebacks: bool = False) -> str:
        """Every record, one line each (with ``tracebacks``, each failed call's below)."""
        return report(self.records, tracebacks=tracebacks)


def _dead_letters_found(letters: list[Record], why: str) -> NoReturn:
    """Raise :class:`DeadLettersFound` for ``letters``, caused by the first failure."""
    __tracebackhide__ = True
    cause = next((trimmed(r.error) for r in letters if r.error is not None), None)
    raise DeadLettersFound(f"{len(letters)} message(s) dead-lettered {why}:\n"
                           + report(letters), letters) from cause


def _load(busy: int, workers: int, queued: int) -> str:
    return (f"its workers: {busy} of {workers} busy, {queued} "
            f"call{'s' * (queued != 1)} queued")


def _named(message: Message) -> str:
    stream = message.stream
    return f"{shown(stream.namespace)}/{shown(stream.key)} (message {message.id[-8:]})"


def _dead_lettered(record: object) -> DeadLetter:
    """The letter of a dead-lettered record; anything else is refused."""
    if not isinstance(record, Record) or record.letter is None:
        raise InvalidArgumentError(
            f"replay: {_kind(record)[:80]} is not dead-lettered (pass records "
            "of worker.dead_lettered())")
    return record.letter


def _check_listed(items: object, one: type, expected: str) -> None:
    """Refuse, saying ``expected``, ``items`` that are not a list of things: one of them
    (``one``, not in a list), a str (which iterates its letters), a non-iterable."""
    __tracebackhide__ = True
    if isinstance(items, one | str | bytes) or not isinstance(items, Iterable):
        raise InvalidArgumentError(f"{expected}, got {_kind(items)}")


def _raised(error: BaseException) -> str:
    """What a call raised that stopped the worker: ``KeyboardInterrupt()``,
    ``SystemExit(3)``, or pytest's outcome, ``Failed('Timeout (>1.0s) …')`` (whose
    ``repr`` is its message alone)."""
    return repr(error) if isinstance(error, STOPS) else f"{type(error).__name__}({str(error)!r})"


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:200]


def _check_seconds(what: str, value: object) -> None:
    if not is_number(value, 0.0):
        raise InvalidArgumentError(f"{what} must be a finite number >= 0, got {value!r:.100}")
