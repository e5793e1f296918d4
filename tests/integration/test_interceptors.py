"""App interceptors in a daemon: where they sit in the chain, what they may do."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import App, Client, Delivery, HandlerDeclarationError, HandlerSpec, Interceptor, Step
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
    [letter] = await adapter.read_dead_letters("test")
    assert (letter.handler, letter.error_type, letter.attempts) == (
        "refused", "PermissionError", 2)
    assert sum([await adapter.lag(q, "test") for q in range(8)]) == 0
