"""conveyor.testing: the real daemon and delivery chain, settled without sleeps, reported
per message. Every test runs the app's real WorkerDaemon on a private embedded broker."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

import msgspec
import pytest

import conveyor
from conveyor import App, Delivery, HandlerSpec, Interceptor, MessageContext, Publish, Step
from conveyor.adapters import memory
from conveyor.testing import (
    DeadLettersFound,
    NotSettled,
    Outcome,
    StartupHookFailed,
    TestWorker,
)
from conveyor.testing.fixtures import worker_fixture
from tests.conftest import free_port


class Order(msgspec.Struct):
    total: int
    tenant: str = "t1"


def flaky_app(fail_times: dict[int, int], **options: Any) -> tuple[App, Counter[str]]:
    """Orders whose total is in ``fail_times`` fail that many calls first (-1: always)."""
    app = App("kit")
    calls: Counter[str] = Counter()

    @app.handler("orders", **options)
    async def on_order(order: Order, ctx: MessageContext) -> None:
        calls[ctx.message.id] += 1
        allowed = fail_times.get(order.total, 0)
        if allowed < 0 or calls[ctx.message.id] <= allowed:
            raise ValueError(f"order {order.total} failed on call {calls[ctx.message.id]}")

    return app, calls


# -- settling ---------------------------------------------------------------------------
async def test_settle_waits_for_retries_that_succeed_and_records_each_attempt() -> None:
    # Declared back-off: 10 s then 20 s. The kit skips it; settle's 5 s would not wait it.
    app, calls = flaky_app({7: 2}, retry_attempts=3, retry_delay_s=10.0)
    async with TestWorker(app, settle_timeout_s=5.0) as worker:
        published = [await worker.publish("orders", f"o-{n}", {"total": n}) for n in (1, 7, 2)]
        settled = await worker.settle()

    assert [r.message.id for r in settled] == [m.id for m in published]
    assert [r.outcome for r in settled] == [Outcome.HANDLED] * 3
    assert worker.bodies("orders") == [Order(1), Order(7), Order(2)]
    [retried] = worker.retried()
    assert retried.body == Order(7) and calls[retried.message.id] == 3
    assert [a.number for a in retried.attempts] == [1, 2, 3]
    assert [type(a.error) for a in retried.attempts] == [ValueError, ValueError, type(None)]
    assert str(retried.attempts[1].error) == "order 7 failed on call 2"
    assert worker.daemon.stats.retried == 2 and worker.daemon.stats.handled == 3


async def test_delay_scale_one_keeps_the_declared_back_off() -> None:
    app, _ = flaky_app({1: 1}, retry_attempts=2, retry_delay_s=0.3)
    loop = asyncio.get_running_loop()
    async with TestWorker(app, delay_scale=1.0) as worker:
        began = loop.time()
        await worker.publish("orders", "o-1", {"total": 1})
        await worker.settle()
        waited_s = loop.time() - began
    assert waited_s >= 0.3  # the declared back-off, not scaled away
    [record] = worker.retried()
    assert [type(a.error) for a in record.attempts] == [ValueError, type(None)]
    assert worker.bodies() == [Order(1)]


async def test_dead_letters_raise_with_the_handlers_exception_as_the_cause() -> None:
    app, calls = flaky_app({-5: -1}, retry_attempts=3)
    async with TestWorker(app) as worker:
        bad = await worker.publish("orders", "o-bad", {"total": -5})
        good = await worker.publish("orders", "o-good", {"total": 5})
        with pytest.raises(DeadLettersFound) as caught:
            await worker.settle()
        stored = await worker.daemon.adapter.dead_letters.page(app.name)

    error = caught.value
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "order -5 failed on call 3"
    assert "orders/o-bad on_order, 3 attempts: ValueError: order -5 failed on call 3" in str(error)
    assert [r.message.id for r in error.records] == [bad.id]
    [letter] = [s.letter for s in stored]
    assert letter.message.id == bad.id and letter.attempts == 3 and calls[bad.id] == 3
    [dead] = worker.dead_lettered()
    assert dead.letter == letter and dead.body == Order(-5)
    assert [r.message.id for r in worker.handled()] == [good.id]


async def test_settle_can_expect_dead_letters_and_a_body_that_does_not_decode_has_no_attempt(
) -> None:
    app, calls = flaky_app({})
    async with TestWorker(app) as worker:
        await worker.publish("orders", "o-1", {"no_total": 1})
        [record] = await worker.settle(raise_on_dead_letters=False)
    assert record.outcome is Outcome.DEAD_LETTERED and record.attempts == ()
    assert record.letter is not None and record.letter.error_type == "DecodeError"
    assert record.body == {"no_total": 1} and not calls


async def test_settle_only_returns_what_settled_since_the_last_call() -> None:
    app, _ = flaky_app({})
    async with TestWorker(app) as worker:
        await worker.publish("orders", "a", {"total": 1})
        first = await worker.settle()
        await worker.publish("orders", "b", {"total": 2})
        second = await worker.settle()
        third = await worker.settle()
    assert third == []
    assert [r.key for r in first] == ["a"] and [r.key for r in second] == ["b"]
    assert [r.key for r in worker.records] == ["a", "b"]


async def test_records_come_in_publish_order_across_queues() -> None:
    app, _ = flaky_app({})
    async with TestWorker(app) as worker:
        published = [await worker.publish("orders", f"k{n}", {"total": n}) for n in range(60)]
        await worker.settle()
    assert len({m.token.queue for m in published if m.token}) > 1  # spread over queues
    assert [r.message.id for r in worker.records] == [m.id for m in published]


async def test_a_timeout_names_the_unsettled_messages_and_the_running_handler() -> None:
    app = App("kit")
    gate = asyncio.Event()

    @app.handler("slow")
    async def wait_for_gate(body: dict[str, int]) -> None:
        await gate.wait()

    async with TestWorker(app) as worker:
        await worker.publish("slow", "s-1", {"n": 1})
        await worker.publish("slow", "s-1", {"n": 2})  # same stream: waits its turn
        with pytest.raises(NotSettled) as caught:
            await worker.settle(timeout_s=0.3)
        gate.set()
        settled = await worker.settle()
        unsettled = worker.unsettled()
    text = str(caught.value)
    assert text.startswith("not settled after 0.3s (2 messages published, 0 settled):")
    lines = text.splitlines()[1:]
    assert len(lines) == 2
    assert "slow/s-1" in lines[0] and "wait_for_gate attempt 1 running for" in lines[0]
    assert "slow/s-1" in lines[1] and "waiting for message" in lines[1]
    assert len(settled) == 2 and unsettled == []


async def test_an_attempts_number_is_one_more_than_the_handlers_ctx_attempt() -> None:
    """docs/testing.md: ``Attempt.number`` is 1 for the first call, ``ctx.attempt`` counts
    the failed calls before it."""
    app = App("kit")
    told: list[int] = []

    @app.handler("orders", retry_attempts=3)
    async def on_order(body: dict[str, int], ctx: MessageContext) -> None:
        told.append(ctx.attempt)
        if ctx.attempt < 2:
            raise ConnectionError(f"failed call {ctx.attempt + 1}")

    async with TestWorker(app) as worker:
        await worker.publish("orders", "o-1", {"total": 1})
        [record] = await worker.settle()
    assert [a.number for a in record.attempts] == [n + 1 for n in told] == [1, 2, 3]


async def test_a_timeout_says_what_each_held_message_waits_for() -> None:
    """Not a catch-all "waiting for a slot, an earlier message, a batch or its
    acknowledgement": the earlier message of its stream, the earlier message of its queue
    its acknowledgement waits behind, or the back-off before its next attempt."""
    app = App("kit")
    gate = asyncio.Event()

    @app.handler("slow")
    async def wait_for_gate(body: dict[str, int]) -> None:
        if body["n"] == 1:
            await gate.wait()

    @app.handler("flaky", retry_attempts=2, retry_delay_s=60)
    async def fail(body: dict[str, int]) -> None:
        raise ConnectionError("the gateway is down")

    async with TestWorker(app, delay_scale=1, stop_timeout_s=0.5) as worker:
        stuck = await worker.publish("slow", "s-1", {"n": 1})
        behind = await worker.publish("slow", "s-1", {"n": 2})
        queue = worker.client.queue_for("slow", "s-1")
        other = next(k for k in (f"k-{n}" for n in range(1000))
                     if worker.client.queue_for("slow", k) == queue)
        done = await worker.publish("slow", other, {"n": 3})
        failed = await worker.publish("flaky", "f-1", {"n": 4})
        with pytest.raises(NotSettled) as caught:
            await worker.settle(timeout_s=0.3)
        gate.set()  # the flaky one, in its back-off, is abandoned by the stop
    text = str(caught.value)

    def line_of(message: conveyor.Message) -> str:
        [line] = [ln for ln in text.splitlines() if f"(message {message.id[-8:]})" in ln]
        return line

    assert "wait_for_gate attempt 1 running for" in line_of(stuck)
    assert line_of(behind).endswith(
        f"waiting for message {stuck.id[-8:]} of its stream (handled in order)")
    assert line_of(done).endswith(
        f"done; its acknowledgement waits for message {stuck.id[-8:]}, earlier in the "
        "queue (acknowledged in queue order)")
    assert line_of(failed).endswith(
        "fail attempt 1 failed (ConnectionError: the gateway is down); the next waits "
        "its back-off")


async def test_a_timeout_says_a_pool_or_cell_call_may_be_queued_there() -> None:
    """A call queued in its pool or cell has entered the handler's chain like one that
    runs: the line says so, with the pool's or the cell's load, instead of "running"."""
    app = App("kit")

    @app.handler("renders", stateless=True, max_workers=1)
    async def render(n: int) -> None:
        await asyncio.Event().wait()

    @app.handler("provision", cell_key="header:tenant", cell_size=1)
    async def provision(n: int) -> None:
        await asyncio.Event().wait()

    async with TestWorker(app, stop_timeout_s=0.1) as worker:
        for key in ("r-1", "r-2"):
            await worker.publish("renders", key, 1)
        for key in ("p-1", "p-2"):
            await worker.publish("provision", key, 1, headers={"tenant": "acme"})
        with pytest.raises(NotSettled) as caught:
            await worker.settle(timeout_s=0.2)
    held = dict(line.split(": ", 1)[1].split(" (message ", 1)
                for line in str(caught.value).splitlines()[1:])
    assert sorted(held) == ["provision/p-1", "provision/p-2", "renders/r-1", "renders/r-2"]
    states = [held[stream].split("): ", 1)[1] for stream in sorted(held)]
    for state in states[:2]:
        assert re.fullmatch(r"provision attempt 1 running or queued in cell 'acme' for "
                            r"0\.\ds \(its workers: 1 of 1 busy, 1 call queued\)", state), state
    for state in states[2:]:
        assert re.fullmatch(r"render attempt 1 running or queued in its pool for 0\.\ds "
                            r"\(its workers: 1 of 1 busy, 1 call queued\)", state), state


async def test_a_timeout_counts_what_was_published_so_a_loop_shows() -> None:
    """A handler that publishes to its own namespace for ever: the two messages held at
    the timeout look ordinary; the count published says it is a loop."""
    app = App("kit")
    clients: list[conveyor.Client] = []

    @app.startup
    async def connect(client: conveyor.Client) -> None:
        clients.append(client)

    @app.handler("ticks")
    async def tick(n: int) -> None:
        await clients[0].publish("ticks", "t", n + 1)

    async with TestWorker(app, stop_timeout_s=0.5) as worker:
        await worker.publish("ticks", "t", 0)
        with pytest.raises(NotSettled) as caught:
            await worker.settle(timeout_s=0.3)
    header = str(caught.value).splitlines()[0]
    counted = re.fullmatch(r"not settled after 0\.3s \((\d+) messages published, (\d+) "
                           r"settled\):", header)
    assert counted is not None, header
    published, settled = map(int, counted.groups())
    assert published > 20 and 0 < published - settled <= 2, header


async def test_a_timeout_names_a_startup_hook_still_running() -> None:
    app, _ = flaky_app({})
    gate = asyncio.Event()

    seeded: list[bool] = []

    @app.startup
    async def seed(client: conveyor.Client) -> None:
        await gate.wait()
        seeded.append(True)

    async with TestWorker(app) as worker:
        with pytest.raises(NotSettled, match=r"startup hook .*seed still running"):
            await worker.settle(timeout_s=0.1)
        before = list(seeded)
        gate.set()
        await worker.settle()
        after = list(seeded)
    assert before == []
    assert after == [True]  # settle returned once the hook had finished


# -- the app's features, through the real chain -------------------------------------------
async def test_app_interceptors_wrap_every_attempt_and_can_fail_it() -> None:
    seen: list[tuple[str, int]] = []

    class Audit(Interceptor):
        def wrap(self, handler: HandlerSpec, next: Step) -> Step:
            async def audited(delivery: Delivery) -> Any:
                seen.append((delivery.message.stream.key, delivery.attempt))
                if delivery.message.headers.get("veto"):
                    raise PermissionError("vetoed by Audit")
                return await next(delivery)

            return audited

    app = App("kit", interceptors=[Audit()])
    calls: Counter[str] = Counter()

    @app.handler("orders", retry_attempts=2)
    async def on_order(order: Order, ctx: MessageContext) -> None:
        calls[ctx.message.stream.key] += 1
        if order.total == 1 and calls["a"] == 1:
            raise ValueError("first call fails")

    async with TestWorker(app) as worker:
        await worker.publish("orders", "a", {"total": 1})
        await worker.publish("orders", "b", {"total": 2}, headers={"veto": "yes"})
        await worker.settle(raise_on_dead_letters=False)

    assert sorted(seen) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert calls == {"a": 2}  # the veto never reached the handler
    [vetoed] = worker.dead_lettered()
    assert vetoed.key == "b" and [type(a.error) for a in vetoed.attempts] == [PermissionError] * 2


async def test_pool_and_cell_handlers_run_on_their_pool_and_cells() -> None:
    app = App("kit")
    pooled: list[int] = []
    by_tenant: dict[str, list[int]] = {}

    @app.handler("jobs", name="pooled_job", stateless=True, max_workers=2)
    async def pooled_job(order: Order) -> None:
        pooled.append(order.total)

    @app.handler("jobs", name="per_tenant", cell_key="body:tenant", cell_size=1)
    async def per_tenant(order: Order) -> None:
        by_tenant.setdefault(order.tenant, []).append(order.total)

    async with TestWorker(app) as worker:
        for n in range(6):
            await worker.publish("jobs", f"j{n}", {"total": n, "tenant": f"t{n % 2}"})
        settled = await worker.settle()
        pool_created = worker.daemon.pools["pooled_job"].created
        cells = worker.daemon.cells["per_tenant"].cells
        cell_handled = {name: cell.handled for name, cell in cells.items()}
    assert pool_created >= 1
    assert cell_handled == {"t0": 3, "t1": 3}

    assert len(settled) == 12  # 6 messages x 2 handlers, each settled once per handler
    assert sorted(pooled) == list(range(6))
    assert {t: sorted(n) for t, n in by_tenant.items()} == {"t0": [0, 2, 4], "t1": [1, 3, 5]}
    assert [r.handler for r in settled[:2]] == ["pooled_job", "per_tenant"]
    assert worker.bodies(handler=per_tenant) == [Order(n, f"t{n % 2}") for n in range(6)]


async def test_a_batch_handler_is_called_per_batch_and_its_poison_message_dead_lettered(
) -> None:
    app = App("kit")

    # batch_wait_ms of 10 s: the kit cuts the batch from what has arrived at once.
    @app.handler("clicks", batch_size=8, batch_wait_ms=10_000, retry_attempts=2)
    async def store_clicks(clicks: list[Order]) -> None:
        if any(c.total < 0 for c in clicks):
            raise ValueError("a negative click")

    async with TestWorker(app, settle_timeout_s=5.0) as worker:
        await worker.publish_batch(
            Publish("clicks", "page", {"total": n}) for n in (1, 2, -3, 4))
        await worker.settle(raise_on_dead_letters=False)

    [poison] = worker.dead_lettered()
    assert poison.body == Order(-3) and poison.letter is not None
    assert poison.letter.attempts == 2 and poison.letter.error == "a negative click"
    assert worker.bodies() == [Order(1), Order(2), Order(4)]
    # The batch fails twice (its retry), then the bisection finds the poison message.
    calls = [([c.total for c in call.bodies], call.error is None)
             for call in worker.batches(handler="store_clicks")]
    assert calls == [([1, 2, -3, 4], False), ([1, 2, -3, 4], False), ([1, 2], True),
                     ([-3, 4], False), ([-3], False), ([-3], False), ([4], True)]


async def test_an_idempotent_handler_absorbs_a_redelivered_message() -> None:
    app = App("kit")
    runs: Counter[str] = Counter()

    @app.handler("payments", idempotent=True)
    async def charge(body: dict[str, int], ctx: MessageContext) -> None:
        runs[ctx.message.id] += 1

    async with TestWorker(app) as worker:
        paid = await worker.publish("payments", "p-1", {"cents": 500})
        await worker.settle()
        again = await worker.redeliver(paid)
        [record] = await worker.settle()

    assert again.id == paid.id and again.token != paid.token
    assert runs == {paid.id: 1}
    assert record.outcome is Outcome.DEDUPLICATED and record.attempts == ()
    assert [r.outcome for r in worker.records] == [Outcome.HANDLED, Outcome.DEDUPLICATED]
    assert worker.deduplicated("payments", handler=charge) == [record]


async def test_a_redelivered_message_counts_its_delivery_as_after_a_crash() -> None:
    """``ctx.deliveries`` is 2 on a message redelivered once, as on a broker that counts
    them; past ``max_deliveries`` it is dead-lettered with ``DeliveryLimit``, unrun."""
    app = App("kit")
    seen: list[int] = []

    @app.handler("renders", max_deliveries=2)
    async def render(body: dict[str, int], ctx: MessageContext) -> None:
        seen.append(ctx.deliveries)

    async with TestWorker(app) as worker:
        first = await worker.publish("renders", "r-1", {"page": 1})
        await worker.settle()
        second = await worker.redeliver(first)
        await worker.settle()
        third = await worker.redeliver(second)
        [over] = await worker.settle(raise_on_dead_letters=False)

    assert [m.deliveries for m in (first, second, third)] == [1, 2, 3]
    assert seen == [1, 2]
    assert over.outcome is Outcome.DEAD_LETTERED and over.letter is not None
    assert over.letter.error_type == "DeliveryLimit" and over.attempts == ()


async def test_dead_letters_replayed_after_a_fix_are_handled_and_recorded() -> None:
    """``worker.replay()`` does what ``conveyor dlq replay`` does: each letter's message
    is published again (same id, ``cv-replay-of``) and the letter removed."""
    app = App("kit")
    fixed: list[bool] = []
    handled: list[int] = []

    @app.handler("orders", retry_attempts=2)
    async def on_order(order: Order) -> None:
        if order.total < 0 and not fixed:
            raise ValueError(f"a negative total: {order.total}")
        handled.append(order.total)

    async with TestWorker(app) as worker:
        for total in (-1, 2, -3):
            await worker.publish("orders", f"o{total}", {"total": total})
        first = await worker.settle(raise_on_dead_letters=False)
        letters = worker.dead_lettered()
        fixed.append(True)  # the fix is deployed
        [one] = await worker.replay(letters[:1])
        [three] = await worker.replay()  # the rest
        again = await worker.settle()
        nothing = await worker.replay()
        with pytest.raises(conveyor.InvalidArgumentError, match="not dead-lettered") as bad:
            await worker.replay(worker.handled())

    assert [r.key for r in letters] == ["o-1", "o-3"]
    assert (one.id, three.id) == (letters[0].message.id, letters[1].message.id)
    assert one.headers["cv-replay-of"] and three.headers["cv-replay-of"]
    assert [(r.key, r.outcome) for r in again] == [("o-1", Outcome.HANDLED),
                                                    ("o-3", Outcome.HANDLED)]
    assert sorted(handled) == [-3, -1, 2] and nothing == [] and len(first) == 3
    assert [m.stream.key for m in worker.published("orders")] == ["o-1", "o2", "o-3",
                                                                 "o-1", "o-3"]
    assert "\n" not in str(bad.value)


async def test_replaying_a_record_whose_letter_is_not_stored_is_refused() -> None:
    """As `conveyor dlq replay --id` refuses an id not stored: a record replayed already,
    or one of another TestWorker, replays nothing, rather than return [] as if done."""
    app = App("kit")

    @app.handler("orders", retry_attempts=1)
    async def on_order(order: Order) -> None:
        raise ValueError("always")

    async with TestWorker(app) as other:
        await other.publish("orders", "o-9", {"total": 9})
        await other.settle(raise_on_dead_letters=False)
        [foreign] = other.dead_lettered()

    async with TestWorker(app) as worker:
        for key in ("o-1", "o-2"):
            await worker.publish("orders", key, {"total": 1})
        await worker.settle(raise_on_dead_letters=False)
        first, second = worker.dead_lettered()
        [replayed] = await worker.replay([first])
        await worker.settle(raise_on_dead_letters=False)
        with pytest.raises(conveyor.InvalidArgumentError) as twice:
            await worker.replay([first, second])
        with pytest.raises(conveyor.InvalidArgumentError) as elsewhere:
            await worker.replay(iter([foreign]))
        stored_after = len(worker.published())
        worker.dead_lettered()

    assert replayed.id == first.message.id
    assert str(twice.value) == (
        f"replay: no dead letter stored for orders/o-1 (message {first.message.id[-8:]}) "
        "(replayed already, evicted past [dead_letters] max_entries, or a record of "
        "another TestWorker); nothing was replayed")
    assert f"orders/o-9 (message {foreign.message.id[-8:]})" in str(elsewhere.value)
    assert stored_after == 3  # o-1, o-2 and o-1's one replay: neither refusal published


async def test_settle_waits_for_startup_hooks_and_what_handlers_publish() -> None:
    app = App("kit")
    clients: list[conveyor.Client] = []
    shipped: list[str] = []

    @app.startup
    async def seed(client: conveyor.Client) -> None:
        clients.append(client)
        for _ in range(3):
            await asyncio.sleep(0)  # the hook runs on after the daemon started
        await client.publish("orders", "from-hook", {"total": 9})

    @app.handler("orders")
    async def on_order(order: Order, ctx: MessageContext) -> None:
        await clients[0].publish("shipments", ctx.message.stream.key, {"total": order.total})

    @app.handler("shipments")
    async def on_shipment(order: Order, ctx: MessageContext) -> None:
        shipped.append(ctx.message.stream.key)

    async with TestWorker(app) as worker:
        await worker.publish("orders", "from-test", {"total": 1})
        await worker.settle()

    assert sorted(shipped) == ["from-hook", "from-test"]
    assert sorted(m.stream.key for m in worker.published("shipments")) == sorted(shipped)
    assert len(worker.published()) == 4 and len(worker.handled()) == 4


async def test_a_failing_startup_hook_is_raised_by_settle() -> None:
    app, _ = flaky_app({})

    @app.startup
    async def broken(client: conveyor.Client) -> None:
        raise KeyError("no such table")

    async with TestWorker(app) as worker:
        with pytest.raises(StartupHookFailed, match="broken raised KeyError") as caught:
            await worker.settle()
        again = await worker.settle()
    assert isinstance(caught.value.__cause__, KeyError)
    assert str(caught.value.__cause__) == "'no such table'"
    assert again == []  # reported once: the next settle is quiet


async def test_messages_no_handler_takes_are_skipped_or_dead_lettered_as_configured() -> None:
    app, _ = flaky_app({})
    async with TestWorker(app) as worker:
        await worker.publish("audit", "a-1", {"who": "me"})
        [skipped] = await worker.settle()
    assert skipped.outcome is Outcome.SKIPPED and skipped.handler == ""
    assert skipped.body == {"who": "me"} and worker.skipped("audit") == [skipped]

    config = conveyor.load_config(environ={}, overrides={"dead_letters": {
        "unroutable": "dead-letter"}})
    async with TestWorker(app, config) as worker:
        await worker.publish("audit", "a-1", {"who": "me"})
        with pytest.raises(DeadLettersFound, match=r"audit/a-1 \(no handler\).*Unroutable"):
            await worker.settle()
        stored = await worker.daemon.adapter.dead_letters.page(app.name)
    [letter] = [s.letter for s in stored]  # stored, with its reason and the body as sent
    assert letter.error_type == "Unroutable" and letter.message.stream.key == "a-1"
    assert letter.attempts == 0 and msgspec.json.decode(letter.message.body) == {"who": "me"}


# -- isolation and the fixture ------------------------------------------------------------
async def test_the_users_app_is_left_as_declared_and_workers_share_nothing() -> None:
    app, _ = flaky_app({})
    handlers, interceptors = list(app.handlers), app.interceptors
    async with TestWorker(app) as one, TestWorker(app) as two:
        await one.publish("orders", "o-1", {"total": 1})
        await one.settle()
        await two.settle()
        seen = (len(one.records), two.records, two.published())
    assert one.broker_name != two.broker_name
    assert seen == (1, [], [])
    assert app.handlers == handlers and app.interceptors == interceptors
    assert conveyor.testing.TestWorker.__test__ is False


def test_bad_kit_settings_are_refused_naming_the_setting() -> None:
    app, _ = flaky_app({})
    with pytest.raises(conveyor.InvalidArgumentError, match="delay_scale") as bad_scale:
        TestWorker(app, delay_scale=-1)
    with pytest.raises(conveyor.InvalidArgumentError, match="settle_timeout_s") as bad_timeout:
        worker_fixture(app, settle_timeout_s=float("nan"))
    # One line each, naming the setting.
    assert ["\n" in str(error) for error in (bad_scale.value, bad_timeout.value)] == [
        False, False]
    assert TestWorker(app, delay_scale=0).delay_scale == 0  # the bound itself is fine


@pytest.mark.parametrize("name", ["", "my worker", "2nd", 5])
def test_a_fixture_name_no_test_could_ask_for_is_refused(name: object) -> None:
    # "" and "my worker" made fixtures no test parameter can name (they never ran); 5
    # failed in the kit's own code, "TypeError: __name__ must be set to a string object".
    app, _ = flaky_app({})
    with pytest.raises(conveyor.InvalidArgumentError) as refused:
        worker_fixture(app, name=name)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"worker_fixture name={name!r}: the name a test takes the fixture by, a Python "
        "identifier (name='worker')")


async def test_a_production_config_talks_to_no_server_its_rate_limit_kept_in_process() -> None:
    """A config for Redis with a rate limit shared through it (``[slots.rate] store =
    "redis"``, the default): the kit kept that bucket at ``[redis] url``, so without a
    Redis there every call waited for a token and nothing settled. Its daemon is alone:
    the limit is kept in the process, and applies as declared."""
    app = App("kit")
    started: list[float] = []

    @app.handler("orders")
    async def on_order(order: Order) -> None:
        started.append(time.monotonic())

    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    config = conveyor.load_config(environ={}, overrides={
        "queues": {"adapter": "redis"}, "balancer": {"membership": "redis"},
        "redis": {"url": nobody}, "slots": {"rate": {"per_second": 20}}})
    async with TestWorker(app, config, settle_timeout_s=5.0) as worker:
        await worker.publish_batch(Publish("orders", f"o-{n}", {"total": n}) for n in range(5))
        settled = await worker.settle()

    assert [r.outcome for r in settled] == [Outcome.HANDLED] * 5
    # 20 a second, burst 1: the five calls start 50 ms apart, some 0.2 s in all.
    assert max(started) - min(started) >= 0.15


FIXTURE_APP, FIXTURE_CALLS = flaky_app({})
kit_worker = worker_fixture(FIXTURE_APP, name="kit_worker")


async def test_the_fixture_yields_a_started_worker(kit_worker: TestWorker) -> None:
    await kit_worker.publish("orders", "o-1", {"total": 3})
    assert kit_worker.bodies() == []
    await kit_worker.settle()
    assert kit_worker.bodies() == [Order(3)]
    assert kit_worker.daemon.started


async def test_a_worker_that_cannot_start_leaves_no_broker_behind() -> None:
    app, _ = flaky_app({})
    config = conveyor.load_config(environ={}, overrides={"slots": {
        "kind": "custom", "path": "no_such_module:Supplier"}})
    worker = TestWorker(app, config)
    entered = []
    with pytest.raises(conveyor.ConfigError):
        async with worker:
            entered.append(worker)  # never: the start fails
    assert entered == []
    assert worker.broker_name not in memory._BROKERS
    async with TestWorker(app) as started:
        name = started.broker_name
        registered = name in memory._BROKERS
    assert registered
    assert name not in memory._BROKERS
