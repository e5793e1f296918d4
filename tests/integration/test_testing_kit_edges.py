"""conveyor.testing used as a new user would, hostile or careless: handlers of every kind
documented, and mistakes that must fail in one line naming the problem (found by a walk
through the kit as a user)."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from typing import Any

import pytest

import conveyor
from conveyor import App, Publish
from conveyor.testing import (
    DeadLettersFound,
    NotSettled,
    Outcome,
    StartupHookFailed,
    TestWorker,
    WorkerStopped,
)
from conveyor.testing.worker import STOP_GRACE_S
from tests.conftest import wait_until


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# -- handlers the docs promise ------------------------------------------------------------
async def test_a_plain_def_batch_handler_runs_and_its_calls_are_noted() -> None:
    # docs/sync-handlers.md: "Batch handlers (batch_size=N): one thread call per batch".
    # The kit wrapped every batch handler in an `async def` recorder, so a plain `def`
    # one was dead-lettered with "... returned a coroutine: declare it `async def`".
    app = App("rows")
    stored: list[list[int]] = []

    @app.handler("rows", batch_size=10)
    def store(rows: list[int]) -> None:
        if -1 in rows:
            raise ValueError("a negative row")
        stored.append(list(rows))

    async with TestWorker(app) as worker:
        await worker.publish_batch([Publish("rows", "k", n) for n in (1, 2, -1, 3)])
        await worker.settle(raise_on_dead_letters=False)

    assert sorted(n for rows in stored for n in rows) == [1, 2, 3]
    [poison] = worker.dead_lettered("rows")
    assert poison.body == -1 and poison.letter is not None
    assert poison.letter.error == "a negative row"
    assert [r.body for r in worker.handled("rows")] == [1, 2, 3]
    calls = worker.batches(store)
    assert calls[0].bodies == (1, 2, -1, 3) and isinstance(calls[0].error, ValueError)
    assert calls[-1].error is None
    assert worker.daemon.threads.peak_running >= 1  # it ran on a handler thread


async def test_a_handler_raising_a_base_exception_has_each_attempt_recorded() -> None:
    # docs/writing-handlers.md: a CancelledError nothing sent, or a BaseException of the
    # user's own, fails the call like any exception (HandlerCancelled, HandlerBaseException).
    # The kit's recorder let BaseExceptions through unrecorded: the records had no
    # attempts, no error (settle's DeadLettersFound had no cause), and a call that failed
    # so and then succeeded was reported handled on its first and only attempt.
    class Abort(BaseException):
        """A BaseException of the user's own, neither Exception nor a stop."""

    app = App("base")
    calls = {"n": 0}

    @app.handler("cancelled", retry_attempts=2)
    async def cancelled(n: int) -> None:
        raise asyncio.CancelledError()

    @app.handler("aborted", retry_attempts=2)
    async def aborted(n: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Abort("not now")

    async with TestWorker(app) as worker:
        await worker.publish("cancelled", "k", 1)
        await worker.publish("aborted", "k", 1)
        with pytest.raises(DeadLettersFound) as found:
            await worker.settle()

    assert isinstance(found.value.__cause__, conveyor.ConveyorError)
    assert "CancelledError" in str(found.value.__cause__)
    [dead] = worker.dead_lettered("cancelled")
    assert [a.number for a in dead.attempts] == [1, 2]
    assert all("CancelledError" in str(a.error) for a in dead.attempts)
    assert isinstance(dead.error, conveyor.ConveyorError)
    [handled] = worker.handled("aborted")
    assert handled.retried
    assert [a.number for a in handled.attempts] == [1, 2]
    assert "Abort: not now" in str(handled.attempts[0].error)
    assert handled.attempts[1].error is None


async def test_settle_returns_when_a_handler_that_blocked_the_loop_past_its_deadline_is_done(
) -> None:
    # A blocking call in an async handler (a mistake Conveyor survives and names) made
    # the deadline pass while the loop was blocked; by the time it fired the message was
    # acknowledged, yet settle() raised NotSettled listing nothing.
    app = App("blocking")

    @app.handler("slow")
    async def slow(seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - the mistake under test

    async with TestWorker(app) as worker:
        await worker.publish("slow", "k", 0.4)
        settled = await worker.settle(timeout_s=0.1)
    assert [r.outcome for r in settled] == [Outcome.HANDLED]


# -- mistakes ---------------------------------------------------------------------------
def two_handlers() -> App:
    app = App("named")

    @app.handler("orders")
    async def on_order(n: int) -> None:
        """Takes the order; nothing to check here but the name."""

    @app.handler("orders", name="audit")
    async def audit_order(n: int) -> None:
        """The second handler of the namespace, named "audit"."""

    return app


async def test_a_misspelt_handler_name_is_refused_not_matched_by_nothing() -> None:
    # `assert not worker.dead_lettered(handler="on_ordr")` passed whatever happened.
    app = two_handlers()
    refusals = []
    async with TestWorker(app) as worker:
        await worker.publish("orders", "k", 1)
        await worker.settle()
        short, other = worker.handled(handler="on_order"), worker.handled(handler="audit")
        full = worker.handled(handler=app.handlers[0].name)  # module.function
        for read in (worker.handled, worker.dead_lettered, worker.retried,
                     worker.deduplicated, worker.bodies, worker.batches):
            with pytest.raises(conveyor.InvalidArgumentError) as typo:
                read(handler="on_ordr")  # type: ignore[operator]
            refusals.append(one_line(typo.value))
    assert len(short) == 1 and len(other) == 1 and full == short
    assert refusals == 6 * [
        "'on_ordr' is not a handler of app 'named' (its handlers: audit, on_order)"]


async def test_a_namespace_filter_that_cannot_match_is_refused_naming_it() -> None:
    # worker.handled(3), handled("") or handled("a\nb") returned [] (no namespace is
    # one), as did handled("ordrs"), a namespace no handler of the app takes: an
    # `assert not worker.handled("ordrs")` passed whatever happened.
    app = two_handlers()
    async with TestWorker(app) as worker:
        await worker.publish("orders", "k", 1)
        await worker.publish("stray", "k", 2)
        await worker.settle()
        refusals: list[str] = []
        for read in (worker.handled, worker.bodies, worker.retried, worker.deduplicated,
                     worker.dead_lettered, worker.skipped, worker.published):
            for bad in (3, b"orders", "", "a\nb", "x" * 300):
                with pytest.raises(conveyor.InvalidArgumentError) as refused:
                    read(bad)  # type: ignore[operator]
                refusals.append(one_line(refused.value))
        typos: list[str] = []
        for read in (worker.handled, worker.bodies, worker.retried, worker.deduplicated,
                     worker.dead_lettered):
            with pytest.raises(conveyor.InvalidArgumentError) as typo:
                read("ordrs")  # type: ignore[operator]
            typos.append(one_line(typo.value))
        with pytest.raises(conveyor.InvalidArgumentError) as never_skipped:
            worker.skipped("orders")
        # what can match is still taken: a namespace no handler takes is skipped, and
        # published to
        found = (len(worker.handled("orders")), worker.skipped("stray")[0].body,
                 len(worker.published(namespace="stray")))
    assert found == (2, 2, 1)
    # or, configured so, dead-lettered
    keep = conveyor.load_config(environ={}, overrides={
        "dead_letters": {"unroutable": "dead-letter"}})
    async with TestWorker(app, keep) as worker:
        await worker.publish("stray", "k", 3)
        await worker.settle(raise_on_dead_letters=False)
        [kept] = worker.dead_lettered("stray")
    assert kept.body == 3
    assert refusals[:5] == [
        "handled(namespace=3): the namespace must be a non-empty string",
        "handled(namespace=b'orders'): the namespace must be a non-empty string",
        "handled(namespace=''): the namespace must be a non-empty string",
        "handled(namespace='a\\nb'): the namespace holds a control character ('\\n'): "
        "a namespace is one line",
        "handled(namespace='" + "x" * 100 + "'… (300 characters)): the namespace is longer "
        "than 255 characters, the most a namespace may be",
    ]
    calls = ["handled", "bodies", "retried", "deduplicated", "dead_lettered", "skipped",
             "published"]
    assert [r.partition("(")[0] for r in refusals] == [c for c in calls for _ in range(5)]
    assert typos == [f"{call}(namespace='ordrs'): no handler of app 'named' takes that "
                     "namespace (its namespaces: orders)" for call in calls[:5]]
    assert one_line(never_skipped.value) == (
        "skipped(namespace='orders'): app 'named' has handlers of that namespace, so its "
        "messages are never skipped")


async def test_a_bound_method_handler_is_found_by_the_method() -> None:
    """docs/testing.md: ``handler`` may be "the handler function itself"; a bound method
    handler (docs/writing-handlers.md) is a new object at each attribute access, so an
    identity test refused ``handler=service.on_order`` as "not a handler"."""

    class Service:
        async def on_order(self, n: int) -> None:
            """Handles orders; the test only looks it up."""

    app = App("bound")
    service = Service()
    app.handler("orders")(service.on_order)
    async with TestWorker(app) as worker:
        await worker.publish("orders", "k", 1)
        await worker.settle()
        found = worker.handled(handler=service.on_order)
        with pytest.raises(conveyor.InvalidArgumentError, match="is not a handler"):
            worker.handled(handler=Service().on_order)  # another instance's: not this one
    assert [r.key for r in found] == ["k"]


async def test_a_stopped_worker_says_so_instead_of_taking_messages_nobody_handles() -> None:
    # After the stop, publish() stored the message silently, settle() then waited its
    # whole timeout for it ("not pulled yet"), and start() said "started already".
    app = two_handlers()
    worker = TestWorker(app, settle_timeout_s=5.0)
    async with worker:
        await worker.publish("orders", "k", 1)
        await worker.settle()
    began = time.monotonic()
    with pytest.raises(conveyor.ConveyorError) as publishing:
        await worker.publish("orders", "k", 2)
    assert "stopped" in one_line(publishing.value)
    with pytest.raises(conveyor.ConveyorError) as redelivering:
        await worker.redeliver(worker.published()[0])
    assert "stopped" in one_line(redelivering.value)
    assert await worker.settle() == []  # nothing is left: settled, at once
    with pytest.raises(conveyor.ConveyorError) as starting:
        await worker.start()
    assert "stopped" in one_line(starting.value)
    assert time.monotonic() - began < 1.0
    assert len(worker.handled()) == 2  # the records stay readable


async def test_a_stopped_worker_with_messages_left_does_not_wait_for_them() -> None:
    app = App("stuck")

    @app.handler("slow")
    async def slow(n: int) -> None:
        await asyncio.Event().wait()

    worker = TestWorker(app, stop_timeout_s=0.1)
    async with worker:
        await worker.publish("slow", "k", 1)
        with pytest.raises(NotSettled):
            await worker.settle(timeout_s=0.1)
    began = time.monotonic()
    with pytest.raises(NotSettled, match="stopped") as left:
        await worker.settle(timeout_s=5.0)
    assert time.monotonic() - began < 1.0
    assert "slow/k" in str(left.value)


async def test_an_abandoned_def_handler_runs_on_outside_the_next_workers_records() -> None:
    """docs/testing.md: the stop abandons a plain ``def`` handler that does not return;
    its thread runs on during the next test, whose TestWorker records nothing of it."""
    app = App("threads")
    release = threading.Event()
    finished: list[int] = []

    @app.handler("jobs")
    def stuck(n: int) -> None:
        release.wait(10)
        finished.append(n)

    async with TestWorker(app, stop_timeout_s=0.1) as first:
        await first.publish("jobs", "j-1", 1)
        with pytest.raises(NotSettled):
            await first.settle(timeout_s=0.1)
    async with TestWorker(app) as second:
        release.set()
        await wait_until(lambda: finished == [1], 5, what="the abandoned call's end")
        await second.settle()
        assert second.records == [] and second.published() == []
    assert first.records == []  # never acknowledged: nothing settled


async def test_a_handler_that_swallows_its_cancellation_fails_the_stop_not_hangs_it() -> None:
    """A handler whose bare ``except`` catches the stop's ``CancelledError`` on every turn
    of its loop goes on running: the stop would wait for it for ever, and the test with
    it. The stop gives up past ``stop_timeout_s`` and a grace, naming the call."""
    app = App("stubborn")
    let_go = asyncio.Event()
    caught: list[str] = []

    @app.handler("jobs")
    async def stubborn(n: int) -> None:
        while not let_go.is_set():
            try:
                await asyncio.sleep(0.02)
            except BaseException as exc:  # the mistake under test
                caught.append(type(exc).__name__)

    began = time.monotonic()
    worker = TestWorker(app, stop_timeout_s=0.2)
    try:
        with pytest.raises(conveyor.ConveyorError) as stuck:
            async with worker:
                await worker.publish("jobs", "j-1", 1)
                with pytest.raises(NotSettled):
                    await worker.settle(timeout_s=0.2)
        took = time.monotonic() - began
    finally:
        let_go.set()  # or the loop's own close would wait for it
    assert took < 0.2 + 0.2 + STOP_GRACE_S + 1.5, took
    text = one_line(stuck.value)
    assert text.startswith(f"the stop did not end within stop_timeout_s + {STOP_GRACE_S:g}s: "
                           "handler call(s) still running after their cancellation: "
                           "stubborn on jobs/j-1 (message "), text
    assert "must raise it again" in text
    assert caught and set(caught) == {"CancelledError"}  # the stop's, caught each time


async def test_a_taskgroup_handler_is_not_named_as_one_that_swallowed_the_stop() -> None:
    """Python 3.11's ``TaskGroup`` leaves a cancel count on the task when a child fails
    after the body (CPython gh-116720): a call that used one, long before the stop, was
    named among those that "caught their cancellation and went on". Only calls ending
    while the kit stops the daemon are looked at."""
    app = App("taskgroup-kit")
    let_go = asyncio.Event()

    async def fails_late() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("a child failed after the TaskGroup's body ended")

    late: list[str] = []
    caught: list[str] = []

    @app.handler("groups")
    async def grouped(n: int) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(fails_late())
        except* ValueError as group:
            late.extend(str(exc) for exc in group.exceptions)

    @app.handler("jobs")
    async def stubborn(n: int) -> None:
        while not let_go.is_set():
            try:
                await asyncio.sleep(0.02)
            except BaseException as exc:  # the mistake the stop's error is about
                caught.append(type(exc).__name__)

    worker = TestWorker(app, stop_timeout_s=0.2)
    try:
        with pytest.raises(conveyor.ConveyorError) as stuck:
            async with worker:
                await worker.publish("groups", "g-1", 1)
                await worker.settle()
                await worker.publish("jobs", "j-1", 1)
                with pytest.raises(NotSettled):
                    await worker.settle(timeout_s=0.2)
    finally:
        let_go.set()
    text = one_line(stuck.value)
    assert "stubborn on jobs/j-1" in text and "grouped" not in text, text
    assert late == ["a child failed after the TaskGroup's body ended"]  # it did fail late
    assert caught and set(caught) == {"CancelledError"}


async def test_a_handler_that_swallows_its_cancellation_and_returns_lets_the_stop_end(
        ) -> None:
    """One that catches it and returns has handled its message: the agent honours the
    cancel its handler swallowed, and the stop ends with nothing held."""
    app = App("returns")
    started = asyncio.Event()

    @app.handler("jobs")
    async def gives_up(n: int) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except BaseException:  # the mistake, but it returns
            return

    worker = TestWorker(app, stop_timeout_s=0.2)
    await worker.start()
    await worker.publish("jobs", "j-1", 1)
    await asyncio.wait_for(started.wait(), 5)
    async with asyncio.timeout(0.2 + STOP_GRACE_S):
        report = await worker.stop()
    assert report is not None


async def test_wrong_arguments_are_refused_in_one_line_naming_them() -> None:
    app = two_handlers()
    with pytest.raises(conveyor.InvalidArgumentError) as not_an_app:
        TestWorker("named")  # type: ignore[arg-type]
    assert one_line(not_an_app.value).startswith("TestWorker(app): expected a conveyor.App")
    with pytest.raises(conveyor.InvalidArgumentError) as not_a_config:
        TestWorker(app, {"slots": {"count": 1}})  # type: ignore[arg-type]
    assert "expected a conveyor.Config" in one_line(not_a_config.value)
    with pytest.raises(conveyor.InvalidArgumentError, match="settle_timeout_s"):
        TestWorker(app, settle_timeout_s=True)
    with pytest.raises(conveyor.InvalidArgumentError, match="stop_timeout_s"):
        TestWorker(app, stop_timeout_s=10**400)  # OverflowError, naming nothing
    refused: list[str] = []
    async with TestWorker(app) as worker:
        for timeout in ("5", float("nan"), -1.0, 10**400):
            with pytest.raises(conveyor.InvalidArgumentError) as bad_timeout:
                await worker.settle(timeout)  # type: ignore[arg-type]
            refused.append(one_line(bad_timeout.value)[:26])
        with pytest.raises(conveyor.InvalidArgumentError) as not_a_message:
            await worker.redeliver("o-1")  # type: ignore[arg-type]
        with pytest.raises(conveyor.InvalidArgumentError) as not_a_publish:
            await worker.publish_batch([("orders", "k", 1)])  # type: ignore[list-item]
        published = worker.published()
    assert refused == ["settle timeout_s must be a"] * 4
    assert "redeliver: expected a Message" in one_line(not_a_message.value)
    assert "expected conveyor.Publish" in one_line(not_a_publish.value)
    assert published == []  # nothing of a refused batch was sent
    with pytest.raises(conveyor.ConveyorError, match="not started") as early:
        await TestWorker(app).settle()
    assert "async with" in one_line(early.value)


async def test_reading_records_before_the_start_is_refused_not_an_empty_list() -> None:
    # A fixture that forgot to start its worker gave records == [] and handled() == []:
    # a test asserting that nothing was dead-lettered passed over a worker never run.
    worker = TestWorker(two_handlers())
    reads = {
        "records": lambda: worker.records,
        "handled": lambda: worker.handled("orders"),
        "dead_lettered": worker.dead_lettered,
        "retried": worker.retried,
        "skipped": worker.skipped,
        "deduplicated": worker.deduplicated,
        "bodies": worker.bodies,
        "batches": worker.batches,
        "report": worker.report,
        "published": worker.published,
        "unsettled": worker.unsettled,
    }
    said = {}
    for name, read in reads.items():
        with pytest.raises(conveyor.ConveyorError) as early:
            read()
        said[name] = one_line(early.value)
    for name, text in said.items():
        assert text.startswith("the TestWorker is not started: "), (name, text)
        assert "async with" in text, name
    async with worker:
        await worker.publish("orders", "o-1", 1)
        await worker.settle()
    assert [r.key for r in worker.records] == ["o-1"] * 2  # once stopped: readable still
    assert [r.key for r in worker.handled("orders")] == ["o-1"] * 2


def test_a_plain_def_test_driving_a_worker_with_asyncio_run_is_told_to_be_async() -> None:
    # A sync test given the fixture's worker (pytest-asyncio starts it on its loop) that
    # ran asyncio.run(worker.publish(...)) was told about pytest-asyncio's loop scopes.
    runner = asyncio.Runner()
    worker = runner.run(TestWorker(two_handlers()).start())
    try:
        with pytest.raises(conveyor.ConveyorError) as other_loop:
            asyncio.run(worker.publish("orders", "o", 1))
        read = worker.published()  # reading needs no loop
    finally:
        runner.run(worker.stop())
        runner.close()
    assert read == []
    text = one_line(other_loop.value)
    assert text.startswith("cannot publish: this TestWorker was started on another event "
                           "loop"), text
    assert "a plain def test cannot drive it (asyncio.run runs another loop): make the test " \
        "async def" in text, text


@pytest.mark.parametrize("telemetry", ["otel", {"enabled": True}, 1],
                         ids=["str", "dict", "int"])
def test_telemetry_that_is_not_a_telemetry_is_refused_where_the_worker_is_made(
        telemetry: object) -> None:
    # TestWorker(app, telemetry="otel") was taken, and its start failed deep in the
    # daemon's build: AttributeError: 'str' object has no attribute 'tracer'.
    with pytest.raises(conveyor.InvalidArgumentError) as refused:
        TestWorker(two_handlers(), telemetry=telemetry)  # type: ignore[arg-type]
    assert one_line(refused.value).startswith(
        "TestWorker(telemetry=...): expected a conveyor.platform.telemetry.Telemetry "), (
        refused.value)


@pytest.mark.parametrize("items", [None, Publish("orders", "k", 1), "orders", 3],
                         ids=["None", "one Publish", "str", "int"])
async def test_publish_batch_of_no_list_is_refused_in_one_line(items: object) -> None:
    # publish_batch(None) or publish_batch(Publish(...)) (one item, not in a list) raised
    # TypeError: '... object is not iterable' from inside the kit; a str was taken for a
    # list of its letters.
    async with TestWorker(two_handlers()) as worker:
        with pytest.raises(conveyor.InvalidArgumentError) as refused:
            await worker.publish_batch(items)  # type: ignore[arg-type]
        assert worker.published() == []
    assert one_line(refused.value).startswith(
        "publish_batch: expected a list of conveyor.Publish items, got ")


@pytest.mark.parametrize("records", ["one record", "abc", 5], ids=["one Record", "str", "int"])
async def test_replay_of_no_list_of_records_is_refused_in_one_line(records: object) -> None:
    # replay(record) (one, not in a list) and replay(5) raised TypeError: '... object is
    # not iterable' from inside the kit; a str was taken for a list of its letters.
    app = App("replays")

    @app.handler("jobs", retry_attempts=1)
    async def job(n: int) -> None:
        raise ValueError("not yet")

    async with TestWorker(app) as worker:
        await worker.publish("jobs", "j", 1)
        await worker.settle(raise_on_dead_letters=False)
        [record] = worker.dead_lettered()
        given = record if records == "one record" else records
        with pytest.raises(conveyor.InvalidArgumentError) as refused:
            await worker.replay(given)  # type: ignore[arg-type]
        left = worker.dead_lettered()
    assert left == [record]  # nothing replayed
    assert one_line(refused.value).startswith(
        "replay: expected a list of records of worker.dead_lettered() (or None: every "
        "letter stored), got "), refused.value


async def test_a_key_with_control_characters_keeps_the_report_one_line_a_message() -> None:
    app = App("keys")

    @app.handler("k")
    async def take(body: bytes) -> None:
        """Handled: the report's lines name the key."""

    keys = ["a\nb", "\x1b[31mred", "tab\there", "é🎉"]
    async with TestWorker(app) as worker:
        for key in keys:
            await worker.publish("k", key, b"x")
        await worker.settle()
    assert [r.key for r in worker.handled()] == keys  # the keys themselves are kept
    assert worker.report().splitlines() == [
        "handled       k/a\\nb take, 1 attempt",
        "handled       k/\\x1b[31mred take, 1 attempt",
        "handled       k/tab\\there take, 1 attempt",
        "handled       k/é🎉 take, 1 attempt",
    ]


async def test_a_body_nested_too_deeply_is_dead_lettered_and_settles() -> None:
    # The kit's record of the message decoded its body again, raw, and a RecursionError
    # from that failed every acknowledgement: settle() timed out, the stream's next
    # message waited behind it for ever.
    app = App("deep")
    handled: list[object] = []

    @app.handler("trees")
    async def take(tree: list[object]) -> None:
        handled.append(tree)

    async with TestWorker(app, settle_timeout_s=5) as worker:
        await worker.publish("trees", "k", b"[" * 100_000 + b"]" * 100_000)
        await worker.publish("trees", "k", [1])
        records = await worker.settle(raise_on_dead_letters=False)
    assert [r.outcome for r in records] == [Outcome.DEAD_LETTERED, Outcome.HANDLED]
    assert handled == [[1]]
    letter = records[0].letter
    assert letter is not None and letter.error_type == "DecodeError"
    assert letter.error == "cannot decode body as list: it is nested too deeply"


async def test_a_huge_key_is_cut_short_in_the_report_and_the_errors() -> None:
    # A 1 MB key made each report line and settle's DeadLettersFound a megabyte long
    # (a client now refuses a key over 1,024 characters: the longest is cut short too).
    app = App("huge")

    @app.handler("k", retry_attempts=1)
    async def refuse(body: bytes) -> None:
        raise ValueError("refused")

    key = "K" * 1024
    async with TestWorker(app) as worker:
        await worker.publish("k", key, b"x")
        with pytest.raises(DeadLettersFound) as found:
            await worker.settle()
    [line] = worker.report().splitlines()
    assert line == (f"dead-lettered k/{'K' * 100}… (1,024 characters) refuse, "
                    "1 attempt: ValueError: refused")
    assert len(str(found.value)) < 500, str(found.value)[:500]
    assert [r.key for r in worker.dead_lettered()] == [key]  # the key itself is kept


async def test_a_handler_cannot_change_the_headers_its_sibling_and_its_letter_see() -> None:
    # ctx.headers was the message's own dict, shared by every handler of the namespace:
    # one handler's writes reached the next one, and were stored in its dead letter, so
    # a replay published them — reserved names (cv-id, body) included.
    app = App("headers")
    seen: list[dict[str, str]] = []

    @app.handler("orders", retry_attempts=1)
    async def tamper(body: bytes, ctx: conveyor.MessageContext) -> None:
        ctx.headers["cv-id"] = "forged"  # type: ignore[index]

    @app.handler("orders")
    async def read(body: bytes, ctx: conveyor.MessageContext) -> None:
        seen.append(dict(ctx.headers))

    async with TestWorker(app) as worker:
        await worker.publish("orders", "o-1", {}, headers={"tenant": "acme"})
        [refused, handled] = await worker.settle(raise_on_dead_letters=False)
    assert seen == [{"tenant": "acme"}]
    assert refused.letter is not None and refused.letter.error_type == "TypeError"
    assert "does not support item assignment" in refused.letter.error
    assert refused.letter.message.headers == {"tenant": "acme"}
    assert handled.outcome is Outcome.HANDLED


# -- a handler that stops the worker ------------------------------------------------------
def stopping_app(kind: str) -> App:
    """``fatal``: raises KeyboardInterrupt (async def, and a batch handler) or
    SystemExit(3) (plain def) on a body of 1; ``fine``: returns."""
    app = App(f"stopping-{kind}")

    if kind == "async":
        @app.handler("fatal")
        async def fatal(n: int) -> None:
            if n == 1:
                raise KeyboardInterrupt
    elif kind == "def":
        @app.handler("fatal")
        def fatal(n: int) -> None:
            if n == 1:
                sys.exit(3)
    else:
        @app.handler("fatal", batch_size=5)
        async def fatal(batch: list[int]) -> None:
            if 1 in batch:
                raise KeyboardInterrupt

    @app.handler("fine")
    async def fine(n: int) -> None:
        """Returns."""

    return app


@pytest.mark.parametrize("kind", ["async", "def", "batch"])
def test_a_handler_raising_a_stop_fails_its_test_not_the_whole_run(kind: str) -> None:
    # docs/handlers.md: a handler's KeyboardInterrupt or SystemExit stops `conveyor
    # worker` at once. In the kit it left the event loop: pytest's session ended there
    # (KeyboardInterrupt; SystemExit as an INTERNALERROR), no later test ran, and
    # settle() said of the message "pulled, not started". Run here under asyncio.run so
    # that, let through, it fails this test rather than ending the run.
    app = stopping_app(kind)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with TestWorker(app, settle_timeout_s=5) as worker:
            await worker.publish("fine", "f", 0)
            await worker.settle()
            await worker.publish("fatal", "k", 1)
            with pytest.raises(WorkerStopped) as stopped:
                await worker.settle()
            seen["error"] = stopped.value
            seen["unsettled"] = worker.unsettled()
            seen["fine"] = worker.bodies("fine")
            started = time.monotonic()
        seen["exit_s"] = time.monotonic() - started  # no drain waiting for the held call

    try:
        asyncio.run(scenario())
    except (KeyboardInterrupt, SystemExit) as exc:
        pytest.fail(f"the handler's {exc!r} left the kit and would end the test run")
    error = seen["error"]
    assert isinstance(error.__cause__, KeyboardInterrupt if kind != "def" else SystemExit)
    text = one_line(error)
    assert text.startswith(f"handler fatal raised {error.__cause__!r} on fatal/k (message ")
    assert "conveyor worker stops at once there" in text
    assert seen["fine"] == [0]  # what was handled before is kept
    [line] = seen["unsettled"]
    assert line.endswith(f"fatal raised {error.__cause__!r}: held (a worker stops there)")
    assert seen["exit_s"] < 2.0  # the stop, without a drain (stop_timeout_s is 5)


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(2)], ids=repr)
def test_a_startup_hook_raising_a_stop_fails_its_test_not_the_whole_run(
        stop: BaseException) -> None:
    # As a handler's: a hook's KeyboardInterrupt or SystemExit left the event loop and
    # ended the test run (the daemon's log line named the hook the kit's wrapper,
    # "_watched.<locals>.watched").
    app = App("stopping-hook")

    @app.startup
    async def boot(client: conveyor.Client) -> None:
        raise stop

    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with TestWorker(app, settle_timeout_s=5) as worker:
            with pytest.raises(StartupHookFailed) as failed:
                await worker.settle()
            seen["error"] = failed.value
            # conveyor worker is gone: a later settle() says so, as after a handler's
            # stop (it went on as if the worker ran)
            await worker.publish("anything", "a", 1)
            with pytest.raises(WorkerStopped) as again:
                await worker.settle()
            seen["again"] = again.value

    try:
        asyncio.run(scenario())
    except (KeyboardInterrupt, SystemExit) as exc:
        pytest.fail(f"the hook's {exc!r} left the kit and would end the test run")
    error = seen["error"]
    assert error.__cause__ is stop
    assert one_line(error).startswith(
        f"startup hook {boot.__qualname__} raised {type(stop).__name__}")
    assert "which stops conveyor worker at once" in str(error)
    assert seen["again"].__cause__ is stop
    assert one_line(seen["again"]).startswith(
        f"this TestWorker's worker stopped earlier: startup hook {boot.__qualname__} "
        f"raised {stop!r}: conveyor worker handles nothing after that")


async def test_pytests_outcome_raised_in_a_handler_is_the_tests_not_a_retried_failure(
) -> None:
    # pytest.fail() in a handler (or pytest-timeout's Failed, raised wherever the main
    # thread is) was taken by the chain for the handler's failure: retried, then
    # dead-lettered, or handled by the retry, and the test passed.
    app = App("outcome")
    calls: list[int] = []

    @app.handler("jobs", retry_attempts=3)
    async def job(n: int) -> None:
        calls.append(n)
        if len(calls) == 1:
            pytest.fail("the handler was not to be called with 1")

    async with TestWorker(app, settle_timeout_s=5) as worker:
        await worker.publish("jobs", "j", 1)
        with pytest.raises(pytest.fail.Exception) as failed:
            await worker.settle()
        with pytest.raises(WorkerStopped) as again:  # a stop, as a KeyboardInterrupt
            await worker.settle()
    assert str(failed.value) == "the handler was not to be called with 1"
    # named by its type (a pytest outcome's repr is its message alone)
    assert "handler job raised Failed('the handler was not to be called with 1') on " in (
        one_line(again.value))
    assert calls == [1]  # not retried


async def test_pytests_outcome_raised_in_a_startup_hook_is_the_tests() -> None:
    # As in a handler: pytest-timeout's Failed fired in a startup hook that blocked the
    # loop (or a hook's pytest.fail()) ended the hook's task, unseen: the test passed.
    app = App("hook-outcome")

    @app.startup
    async def boot(client: conveyor.Client) -> None:
        pytest.fail("the hook is not to run here")

    async with TestWorker(app, settle_timeout_s=5) as worker:
        with pytest.raises(pytest.fail.Exception) as failed:
            await worker.settle()
        with pytest.raises(WorkerStopped):
            await worker.settle()
    assert str(failed.value) == "the hook is not to run here"


def test_a_settle_after_the_worker_stopped_answers_at_once_naming_the_stop() -> None:
    # After a handler's stop was reported, the next settle() waited its whole
    # settle_timeout_s for the held message (which nothing acknowledges any more), then
    # raised NotSettled: a test that went on after pytest.raises(WorkerStopped) took
    # seconds to learn what it knew.
    app = stopping_app("async")
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with TestWorker(app, settle_timeout_s=5) as worker:
            await worker.publish("fatal", "k", 1)
            with pytest.raises(WorkerStopped) as first:
                await worker.settle()
            await worker.publish("fine", "f", 0)
            started = time.monotonic()
            for _ in range(2):  # every later call, not once
                with pytest.raises(WorkerStopped) as again:
                    await worker.settle()
                seen.setdefault("again", []).append(again.value)
            seen["again_s"] = time.monotonic() - started
            seen["first"] = first.value

    asyncio.run(scenario())
    assert seen["again_s"] < 2.5  # not settle_timeout_s (5 s, twice)
    for error in seen["again"]:
        assert error.__cause__ is seen["first"].__cause__  # the handler's KeyboardInterrupt
        text = one_line(error)
        assert text.startswith("this TestWorker's worker stopped earlier: handler fatal "
                               "raised KeyboardInterrupt() on fatal/k (message "), text
        assert "conveyor worker handles nothing after that" in text


async def test_a_daemon_that_failed_is_named_by_settle_at_once() -> None:
    # A failure of the daemon (an agent task crashed, which stops conveyor worker with
    # exit 1) went unseen by a settle() whose messages were all acknowledged, and one
    # waiting on a message the crash held waited its whole timeout.
    app = App("failing-daemon")
    entered, release = asyncio.Event(), asyncio.Event()

    @app.handler("slow")
    async def slow(n: int) -> None:
        entered.set()
        await release.wait()

    async with TestWorker(app, settle_timeout_s=5) as worker:
        await worker.publish("slow", "s", 1)
        await asyncio.wait_for(entered.wait(), 5)
        settling = asyncio.ensure_future(worker.settle())
        await asyncio.sleep(0)  # settle() is waiting
        started = time.monotonic()
        worker.daemon.agent_crashed(0, RuntimeError("boom"))  # as the agent reports it
        with pytest.raises(WorkerStopped) as stopped:
            await settling
        took = time.monotonic() - started
        release.set()
        with pytest.raises(WorkerStopped):  # and every later call
            await worker.settle()
    assert took < 2.5  # not settle_timeout_s (5 s)
    assert stopped.value.__cause__ is worker.daemon.failure
    text = one_line(stopped.value)
    assert text.startswith("the worker failed: queue 0: an agent task crashed "
                           "(RuntimeError: boom)"), text


async def test_a_timeout_names_the_messages_of_a_batch_call_running() -> None:
    # NotSettled said of the first message of a batch whose call was running "pulled, not
    # started (waiting for a slot, or for its batch)", and of the others "waiting for
    # message ... of its stream": none of them said it was in the call under way.
    app = App("batch-running")
    gate = asyncio.Event()

    @app.handler("rows", batch_size=3)
    async def store(rows: list[int]) -> None:
        await gate.wait()

    async with TestWorker(app) as worker:
        published = await worker.publish_batch([Publish("rows", "k", n) for n in range(5)])
        with pytest.raises(NotSettled) as stuck:
            await worker.settle(timeout_s=0.3)
        lines = str(stuck.value).splitlines()
        for message in published[:3]:
            [line] = [line for line in lines if message.id[-8:] + ")" in line]
            assert re.search(r": store call on a batch of 3 running for 0\.\ds$", line), line
        gate.set()
        settled = await worker.settle()
    assert [r.body for r in settled] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("where", ["startup hook", "handler"])
def test_code_publishing_in_a_loop_is_named_by_settle_in_time(where: str) -> None:
    # The embedded broker's publish returned without letting the event loop run, so a
    # startup hook (or one handler call) publishing in a loop held the loop for good:
    # settle()'s deadline never came and the test hung. A network broker lets the loop
    # run at every publish: so does the kit's now, and NotSettled names the publisher.
    app = App("flood")
    ended = threading.Event()  # lets the loop end if the kit never does (the failure)
    publisher: list[conveyor.Client] = []

    async def flood(client: conveyor.Client) -> None:
        n = 0
        while not ended.is_set():
            n += 1
            await client.publish("floods", "k", n)

    if where == "startup hook":
        app.startup(flood)
    else:
        @app.startup
        async def connect(client: conveyor.Client) -> None:
            publisher.append(client)

        @app.handler("start")
        async def start(n: int) -> None:
            await flood(publisher[0])

    @app.handler("floods")
    async def on_flood(n: int) -> None:
        """Takes each message of the flood."""

    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with TestWorker(app, settle_timeout_s=0.3, stop_timeout_s=0.3) as worker:
            if where == "handler":
                await worker.publish("start", "s", 0)
            with pytest.raises(NotSettled) as stuck:
                await worker.settle()
            seen["error"] = str(stuck.value)
            ended.set()

    began = time.monotonic()
    running = threading.Thread(target=asyncio.run, args=(scenario(),), daemon=True)
    running.start()
    running.join(timeout=3)
    took = time.monotonic() - began
    ended.set()
    running.join(timeout=10)
    assert took < 3, f"settle() held past its deadline by the {where} publishing in a loop"
    first = seen["error"].splitlines()[1]
    if where == "startup hook":
        assert first == "startup hook test_code_publishing_in_a_loop_is_named_by_settle_in_" \
            "time.<locals>.flood still running", seen["error"]
    else:
        assert re.search(r"start/s \(message \w+\): start attempt 1 running for 0\.\ds",
                         seen["error"]), seen["error"]


class Abort(BaseException):
    """A BaseException of the app's own, neither an Exception nor a stop."""


@pytest.mark.parametrize("raised", [asyncio.CancelledError, Abort, GeneratorExit],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "def"])
@pytest.mark.parametrize("place", ["cell", "pool"])
async def test_a_pool_or_cell_handler_raising_a_base_exception_fails_its_call_and_goes_on(
        raised: type[BaseException], sync: bool, place: str) -> None:
    # docs/writing-handlers.md: a CancelledError nothing sent, or a BaseException of the
    # app's own, fails the call like any exception (retried, then dead-lettered). In a
    # cell it ended the cell's worker task instead, and a CancelledError ended a pool's:
    # its message and every later one of that cell or worker waited for ever (an Abort
    # or GeneratorExit came out of the stop).
    app = App("places")
    options: dict[str, Any] = (
        {"cell_key": "body:tenant", "cell_size": 1} if place == "cell"
        else {"stateless": True, "max_workers": 1})

    def check(n: int) -> None:
        if n < 0:
            raise raised()

    if sync:
        @app.handler("jobs", retry_attempts=2, **options)
        def job(body: dict[str, Any]) -> None:
            check(body["n"])
    else:
        @app.handler("jobs", retry_attempts=2, **options)
        async def job(body: dict[str, Any]) -> None:
            check(body["n"])

    async with TestWorker(app, settle_timeout_s=5, stop_timeout_s=0.5) as worker:
        for key, n in (("a", -1), ("b", 1), ("c", 2)):
            await worker.publish("jobs", key, {"tenant": "t1", "n": n})
        await worker.settle(raise_on_dead_letters=False)

    [dead] = worker.dead_lettered()
    assert dead.key == "a" and [a.number for a in dead.attempts] == [1, 2]
    assert dead.letter is not None and raised.__name__ in dead.letter.reason
    assert [b["n"] for b in worker.bodies()] == [1, 2]  # the cell, or the pool, went on


@pytest.mark.parametrize("raised", [asyncio.CancelledError, Abort], ids=lambda c: c.__name__)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "def"])
async def test_batch_calls_failed_by_a_base_exception_are_listed_with_their_failure(
        raised: type[BaseException], sync: bool) -> None:
    # docs/testing.md: worker.batches() is every call of a batch handler, with its error.
    # A call that raised a BaseException (a failure to the chain: retried, bisected,
    # dead-lettered) was left out: only the calls that returned were listed.
    app = App("batch-base")

    def check(rows: list[int]) -> None:
        if -1 in rows:
            raise raised()

    if sync:
        @app.handler("rows", batch_size=3, retry_attempts=2)
        def store(rows: list[int]) -> None:
            check(rows)
    else:
        @app.handler("rows", batch_size=3, retry_attempts=2)
        async def store(rows: list[int]) -> None:
            check(rows)

    async with TestWorker(app) as worker:
        await worker.publish_batch([Publish("rows", "k", n) for n in (1, -1, 2, 3)])
        await worker.settle(raise_on_dead_letters=False)

    calls = worker.batches(store)
    failed = [call for call in calls if call.error is not None]
    assert sum(len(call.bodies) for call in calls if call.error is None) == 3  # 1, 2, 3
    assert failed and all(-1 in call.bodies for call in failed)
    assert failed[0].bodies == (1, -1, 2)
    wanted = "HandlerCancelled" if raised is asyncio.CancelledError else "HandlerBaseException"
    assert {type(call.error).__name__ for call in failed} == {wanted}
    assert all(isinstance(call.error.__cause__, raised) for call in failed)


async def test_a_startup_hook_that_swallows_its_cancellation_is_named_by_the_stop() -> None:
    # A hook that catches the stop's CancelledError and goes on: the daemon's stop goes
    # on without it after a grace (it used to wait for it for ever, and the kit gave up
    # on the stop saying "nothing the kit can name holds it"), and the kit names it.
    app = App("stubborn-hook")
    let_go = asyncio.Event()

    @app.startup
    async def stubborn(client: conveyor.Client) -> None:
        swallowed: list[str] = []
        while not let_go.is_set():
            try:
                await asyncio.sleep(0.02)
            except BaseException as exc:  # the mistake under test
                swallowed.append(type(exc).__name__)

    worker = TestWorker(app, stop_timeout_s=0.2)
    try:
        await worker.start()
        with pytest.raises(conveyor.ConveyorError) as stuck:
            await worker.stop()
    finally:
        let_go.set()  # or the loop's own close would wait for it
    assert worker.drain_report is not None  # the stop was done
    text = one_line(stuck.value)
    assert text.startswith("the stop left startup hook(s) still running after their "
                           f"cancellation: {stubborn.__qualname__} — "), text
    assert "must raise it again" in text
