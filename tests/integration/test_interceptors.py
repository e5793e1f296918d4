"""App interceptors in a daemon: where they sit in the chain, what they may do."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conveyor import (
    App,
    Client,
    Delivery,
    HandlerDeclarationError,
    HandlerSpec,
    HashRingQueueMapper,
    Interceptor,
    Publish,
    Step,
)
from conveyor.examples.audit import Audit
from tests.conftest import wait_until
from tests.integration.memory_harness import daemon, fresh_adapter


async def test_an_audit_interceptor_sees_every_attempt_inside_retry() -> None:
    lines: list[str] = []
    app = App("test", interceptors=[Audit(lines.append)])
    calls: list[int] = []

    @app.handler("jobs", name="flaky", retry_attempts=3, retry_delay_s=0.001)
    async def flaky(body: dict[str, int]) -> None:
        calls.append(body["n"])
        if len(calls) == 1:
            raise ValueError("first attempt fails")

    @app.handler("jobs", name="quiet", audit=False)
    async def quiet(body: dict[str, int]) -> None:
        return None

    adapter = fresh_adapter()
    d = daemon(app, adapter)
    await Client(adapter, d.mapper).publish("jobs", "k", {"n": 1})
    await d.start()
    await wait_until(lambda: d.stats.handled == 2, 10, what="both handlers done")
    await d.stop()
    assert [line.split()[2:4] for line in lines] == [["attempt=1", "ValueError"],
                                                     ["attempt=2", "ok"]]
    assert all(line.startswith("flaky ") for line in lines)  # quiet is not audited
    assert d.stats.retried == 1 and d.stats.dead_lettered == 0


def test_an_interceptors_option_is_checked_when_the_handler_is_declared() -> None:
    app = App("test", interceptors=[Audit()])
    with pytest.raises(HandlerDeclarationError, match="audit must be True or False"):
        app.handler("jobs", audit="no")
    with pytest.raises(HandlerDeclarationError, match="unknown option"):
        App("test").handler("jobs", audit=False)  # no Audit on this app: unknown


class Refuse(Interceptor):
    """Fails every attempt of the handlers it wraps; skips handler "skipped"."""

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        async def refused(delivery: Delivery) -> Any:
            if handler.name == "skipped":
                return None  # never calls the handler: counts as handled, acked
            raise PermissionError(f"{handler.name} refused")

        return refused


async def test_an_interceptor_that_raises_is_retried_then_dead_lettered_and_one_that_skips_acks(
) -> None:
    app = App("test", interceptors=[Refuse()])
    ran: list[str] = []

    @app.handler("jobs", name="refused", retry_attempts=2, retry_delay_s=0.001)
    async def refused(body: dict[str, int]) -> None:
        ran.append("refused")

    @app.handler("jobs", name="skipped")
    async def skipped(body: dict[str, int]) -> None:
        ran.append("skipped")

    adapter = fresh_adapter()
    d = daemon(app, adapter)
    await Client(adapter, d.mapper).publish("jobs", "k", {"n": 1})
    await d.start()
    await wait_until(lambda: d.stats.dead_lettered == 1 and d.stats.handled == 1, 10,
                     what="one dead letter, one skip")
    await d.stop()
    assert ran == []  # neither handler ran
    [letter] = await adapter.dead_letters.read("test")
    assert (letter.handler, letter.error_type, letter.attempts) == (
        "refused", "PermissionError", 2)
    assert sum([await adapter.lag(q, "test") for q in range(8)]) == 0


class BatchAudit(Interceptor):
    """Records what it sees of each call, and fails the calls that carry a poison."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[int] | None, int]] = []

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        async def audited(delivery: Delivery) -> Any:
            batch = delivery.batch
            self.seen.append((handler.name, None if batch is None else
                              [msgspec.json.decode(m.body)["n"] for m in batch],
                              delivery.attempt))
            if batch is not None and any(b["n"] == 13 for b in delivery.body):
                raise ValueError("the interceptor refuses 13")
            return await next(delivery)
        return audited


async def test_an_app_interceptor_wraps_batch_handlers_once_per_call_and_can_fail_it() -> None:
    audit = BatchAudit()
    app = App("test", interceptors=[audit])
    got: list[list[int]] = []

    @app.handler("rows", name="bulk", batch_size=10, batch_wait_ms=50, retry_attempts=1)
    async def bulk(rows: list[dict[str, int]]) -> None:
        got.append([r["n"] for r in rows])

    adapter = fresh_adapter()
    d = daemon(app, adapter)
    client = Client(adapter, d.mapper)
    await client.publish_batch(
        [Publish("rows", "one-stream", {"n": n}) for n in range(10, 16)])
    await d.start()
    await wait_until(lambda: d.stats.handled + d.stats.dead_lettered == 6, 10,
                     what="the batch handled or dead-lettered")
    await d.stop()
    # The whole batch first (the interceptor sees it as one delivery: its messages in
    # queue order, attempt 1), then the bisection's calls: 13 alone is refused by the
    # interceptor and dead-lettered; the handler never saw it.
    assert audit.seen[0] == ("bulk", [10, 11, 12, 13, 14, 15], 1)
    assert all(batch is not None for _, batch, _ in audit.seen)
    assert sorted(n for rows in got for n in rows) == [10, 11, 12, 14, 15]
    assert d.stats.dead_lettered == 1 and d.stats.handled == 5


class Forgetful(Interceptor):
    """Forgot its ``return``: wraps every handler in None."""

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        async def audited(delivery: Delivery) -> Any:
            return await next(delivery)
        audited  # noqa: B018 - the missing `return` is the point


async def test_an_interceptor_whose_wrap_returns_no_step_is_refused_when_the_daemon_is_built(
) -> None:
    app = App("test", interceptors=[Forgetful()])

    @app.handler("jobs", name="job")
    async def job(body: dict[str, int]) -> None:
        return None

    adapter = fresh_adapter()
    await Client(adapter, HashRingQueueMapper(8)).publish("jobs", "k", {"n": 1})
    with pytest.raises(HandlerDeclarationError,
                       match=r"Forgetful.wrap returned None for handler 'job'"):
        daemon(app, adapter)
    # The message is left for the fixed app: not run, not dead-lettered, not lost.
    assert await adapter.dead_letters.read("test") == []
    assert sum([await adapter.lag(q, "test") for q in range(8)]) == 1
