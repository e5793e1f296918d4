"""Plain ``def`` handlers in a real daemon on the embedded adapter: on threads, bounded by
the slots, never stalling the event loop, through the same retry / dead-letter / tracing
chain as ``async def`` ones, abandoned (not waited for) by a drain that times out."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections import Counter

import msgspec
from opentelemetry import trace

from conveyor import App, Client, MessageContext, Publish, WorkerDaemon
from conveyor.workers.daemon import DrainReport
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter
from tests.integration.test_telemetry import by_name, in_memory


class Nap(msgspec.Struct):
    seq: int
    tenant: str = "t0"
    fail: bool = False


class LoopLag:
    """A coroutine ticking every 10 ms: the largest gap between two ticks (from entering
    to leaving) is the worst stall of the event loop meanwhile."""

    def __init__(self) -> None:
        self.max_gap_s = 0.0
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    def _gap(self) -> None:
        now = time.monotonic()
        self.max_gap_s = max(self.max_gap_s, now - self._last)
        self._last = now

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self._gap()

    async def __aenter__(self) -> LoopLag:
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._gap()


class Concurrency:
    """Calls in progress at once, counted from the handlers' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = self.peak = 0
        self.threads: set[str] = set()

    def __enter__(self) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.threads.add(threading.current_thread().name)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1


async def test_the_loop_lag_probe_sees_a_blocking_async_handler() -> None:
    """The control for the probe below: 0.3 s of time.sleep in an ``async def`` stalls
    the loop, and the probe says so (so a small reading below means something)."""
    adapter = fresh_adapter()
    app = App("control")
    done = 0

    @app.handler("naps")
    async def blocks_the_loop(nap: Nap) -> None:
        nonlocal done
        time.sleep(0.3)  # noqa: ASYNC251 - the mistake plain `def` handlers avoid
        done += 1

    d = daemon(app, adapter)
    await Client(adapter, d.mapper).publish("naps", "k", Nap(0))
    async with LoopLag() as lag:
        await d.start()
        await wait_until(lambda: done == 1, what="the blocking call")
    await d.stop()
    assert lag.max_gap_s >= 0.25


def napping_app(name: str) -> tuple[App, Concurrency, Counter[int]]:
    """An app whose plain ``def`` handler sleeps 1 s per message, counting calls at once
    and calls per ``seq``."""
    app = App(name)
    calls = Concurrency()
    handled: Counter[int] = Counter()

    @app.handler("naps")
    def nap(body: Nap) -> None:
        with calls:
            time.sleep(1)
        handled[body.seq] += 1  # one stream per seq: never two calls on one key at once

    return app, calls, handled


async def run_naps(d: WorkerDaemon, client: Client, n: int, handled: Counter[int]
                   ) -> tuple[float, float, DrainReport]:
    """Publish ``n`` naps on ``n`` streams, run ``d`` until all are handled and stop it:
    (seconds from start to the last, the event loop's worst stall meanwhile, the report)."""
    await client.publish_batch(Publish("naps", f"s{i}", Nap(i)) for i in range(n))
    # `conveyor worker` freezes its start-up heap (conveyor.workers.serve), so that the
    # collector's full passes never walk it; so does this run. Without it, a full pass
    # over the heap every earlier test left in this pytest process stalls the loop on
    # its own (0.125 s once, in the whole suite): a stall of the test, not the handlers.
    gc.collect()
    gc.freeze()
    try:
        async with LoopLag() as lag:
            started = time.monotonic()
            await d.start()
            await wait_until(lambda: len(handled) == n, 20, what=f"all {n} naps")
            elapsed = time.monotonic() - started
    finally:
        gc.unfreeze()
    return elapsed, lag.max_gap_s, await d.stop()


async def test_plain_def_handlers_sleep_concurrently_up_to_the_slots_and_never_stall_the_loop(
) -> None:
    """8 streams, one ``time.sleep(1)`` each, 4 slots: 4 at a time on 4 threads, done in
    two rounds (~2 s), while the event loop never goes 0.5 s without running."""
    adapter = fresh_adapter()
    app, calls, handled = napping_app("naps")
    d = daemon(app, adapter, config(slots={"count": 4}))
    elapsed, lag_s, report = await run_naps(d, Client(adapter, d.mapper), 8, handled)
    assert handled == Counter(range(8))  # each once: a graceful run allows no duplicate
    assert calls.peak == 4, "up to the slot bound, not beyond"
    assert d.threads.peak_threads == 4 and len(calls.threads) <= 4
    assert all(name.startswith("conveyor-handler-") for name in calls.threads)
    assert 1.9 < elapsed < 3.5  # two rounds of 1 s, not eight (serial) nor one (unbounded)
    # A handler's time.sleep(1) on the loop would stall it a whole second; a loaded CI
    # machine (two test workers, servers) delays a turn past 0.1 s now and then (0.112).
    assert lag_s < 0.5, f"the event loop stalled {lag_s:.3f}s"
    assert report.acked == 8 and report.abandoned == 0


async def test_a_failing_def_handler_is_retried_then_dead_lettered_like_an_async_one() -> None:
    adapter = fresh_adapter()
    app = App("fails")
    attempts: Counter[int] = Counter()

    @app.handler("naps", retry_attempts=3, retry_delay_s=0.001)
    def flaky(body: Nap, ctx: MessageContext) -> None:
        attempts[body.seq] += 1
        assert ctx.attempt == attempts[body.seq] - 1  # failed deliveries before this one
        if body.fail or attempts[body.seq] == 1:
            raise RuntimeError(f"nap {body.seq} failed on purpose")

    d = daemon(app, adapter)
    await Client(adapter, d.mapper).publish_batch(
        [Publish("naps", "a", Nap(1)), Publish("naps", "b", Nap(2, fail=True))])
    await d.start()
    await wait_until(lambda: d.stats.handled + d.stats.dead_lettered == 2, what="both settled")
    report = await d.stop()
    assert attempts == Counter({1: 2, 2: 3})  # one retry that succeeds; three then a letter
    assert d.stats.handled == 1 and d.stats.dead_lettered == 1 and d.stats.retried == 3
    letters = await adapter.dead_letters.read("fails")
    assert [(x.error_type, x.attempts) for x in letters] == [("RuntimeError", 3)]
    assert "nap 2 failed on purpose" in letters[0].error
    assert report.acked == 2


async def test_a_def_handler_publishing_with_the_daemons_client_from_its_thread_is_refused(
) -> None:
    # `asyncio.run(client.publish(...))` in a def handler's thread, on the client its
    # startup hook got: the memory adapter stored the message from the thread's loop; on
    # Redis it was stored, then the call failed ("attached to a different loop") and its
    # retries stored it again. The daemon's client belongs to the daemon's loop, from
    # its start, even before it ever published.
    adapter = fresh_adapter()
    app = App("threads-publish")
    clients: list[Client] = []

    @app.startup
    async def keep(client: Client) -> None:
        clients.append(client)

    @app.handler("naps", retry_attempts=2, retry_delay_s=0.001)
    def relay(body: Nap) -> None:
        asyncio.run(clients[0].publish("relayed", "k", body))

    d = daemon(app, adapter)
    await d.start()
    await wait_until(lambda: bool(clients), what="the startup hook")
    await Client(adapter, d.mapper).publish("naps", "a", Nap(1))  # not the daemon's
    await wait_until(lambda: d.stats.dead_lettered == 1, what="the letter")
    await d.stop()
    [letter] = await adapter.dead_letters.read("threads-publish")
    assert letter.attempts == 2 and letter.error.startswith(
        "this Client belongs to another event loop"), letter.error
    assert [m.stream.namespace for log in adapter.broker.logs.values()
            for m in log.items] == ["naps"]  # nothing relayed


async def test_a_def_handler_gets_its_message_context_and_the_span_of_its_delivery() -> None:
    adapter = fresh_adapter()
    telemetry, spans, _ = in_memory()
    app = App("traced")
    seen: list[tuple[str, str, int, int]] = []

    @app.handler("naps", name="napper")
    def traced(body: Nap, ctx: MessageContext) -> None:
        span = trace.get_current_span().get_span_context()
        seen.append((ctx.message.stream.key, ctx.handler, span.trace_id, span.span_id))

    d = daemon(app, adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper, telemetry=telemetry)
    await client.publish("naps", "k", Nap(1))
    await d.start()
    await wait_until(lambda: len(seen) == 1, what="the traced call")
    await d.stop()
    (process,) = by_name(spans.get_finished_spans(), "process naps")
    (publish,) = by_name(spans.get_finished_spans(), "publish naps")
    assert seen == [("k", "napper", process.context.trace_id, process.context.span_id)]
    assert process.context.trace_id == publish.context.trace_id  # the producer's trace


async def test_def_batch_idempotent_pooled_and_cell_handlers_run_on_threads() -> None:
    """Every way of declaring a handler also takes a plain ``def``: each call on one of
    the daemon's handler threads, every message handled once (no crash: no duplicate)."""
    adapter = fresh_adapter()
    app = App("kinds")
    where: dict[str, Counter[int]] = {k: Counter() for k in ("batch", "once", "pool", "cell")}
    not_threads: list[str] = []

    def note(kind: str, seqs: list[int]) -> None:
        name = threading.current_thread().name
        if not name.startswith("conveyor-handler-"):
            not_threads.append(name)
        where[kind].update(seqs)

    @app.handler("batch", batch_size=10, batch_wait_ms=20)
    def batch(naps: list[Nap]) -> None:
        if any(n.fail for n in naps):
            raise ValueError("a poison nap in this batch")
        note("batch", [n.seq for n in naps])

    @app.handler("once", idempotent=True)
    def once(nap: Nap) -> None:
        note("once", [nap.seq])

    @app.handler("pool", stateless=True, max_workers=2)
    def pool(nap: Nap) -> None:
        note("pool", [nap.seq])

    @app.handler("cell", cell_key="body:tenant", cell_size=2)
    def cell(nap: Nap) -> None:
        note("cell", [nap.seq])

    d = daemon(app, adapter, config(slots={"count": 8}))
    client = Client(adapter, d.mapper)
    await client.publish_batch(
        Publish(kind, f"s{i % 5}", Nap(i, tenant=f"t{i % 3}", fail=kind == "batch" and i == 7))
        for kind in where for i in range(30))
    await d.start()
    await wait_until(lambda: sum(map(len, where.values())) == 4 * 30 - 1
                     and d.stats.dead_lettered == 1, 20, what="every nap handled")
    await d.stop()
    assert not_threads == []
    assert where["batch"] == Counter(i for i in range(30) if i != 7)  # 7: bisected out
    for kind in ("once", "pool", "cell"):
        assert where[kind] == Counter(range(30)), kind
    (letter,) = await adapter.dead_letters.read("kinds")
    assert letter.error_type == "ValueError"


async def test_a_drain_abandons_a_def_handler_still_running_at_drain_timeout() -> None:
    """A thread cannot be cancelled: the drain waits ``drain_timeout_s`` for it, then
    leaves it running and its message unacknowledged; the next daemon redelivers it."""
    adapter = fresh_adapter()
    app = App("stuck")
    started = threading.Event()
    release = threading.Event()
    calls: Counter[str] = Counter()

    @app.handler("naps")
    def stuck(nap: Nap, ctx: MessageContext) -> None:
        calls[ctx.message.id] += 1
        started.set()
        release.wait(30)

    cfg = config(worker={"drain_timeout_s": 0.3})
    first = daemon(app, adapter, cfg)
    await Client(adapter, first.mapper).publish("naps", "k", Nap(1))
    await first.start()
    await wait_until(started.is_set, what="the call to start")
    t0 = time.monotonic()
    report = await first.stop()
    stop_s = time.monotonic() - t0
    assert stop_s < 1.5, f"stop took {stop_s:.2f}s with drain_timeout_s = 0.3"
    assert report.abandoned == 1 and report.acked == 0
    assert first.threads.running == 1  # abandoned, still on its thread
    release.set()  # the abandoned call returns; its result is dropped
    await wait_until(lambda: first.threads.running == 0, what="the abandoned call to return")
    second = daemon(app, adapter, cfg)
    await second.start()
    await wait_until(lambda: second.stats.handled == 1, what="the redelivery")
    await second.stop()
    # Two runs of one message: the duplicate a drain time-out is allowed to cause.
    assert list(calls.values()) == [2]
