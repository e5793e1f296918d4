"""An ``async def`` handler that returns a coroutine instead of awaiting it (``return
save(x)`` where ``return await save(x)`` was meant): the work never ran, so the call
fails — retried, then dead-lettered with the reason — instead of counting as handled
and its message acknowledged with nothing done. The coroutine is closed, so Python's
"never awaited" warning does not follow it. Every other message runs, in order."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

from conveyor import App
from conveyor.testing import TestWorker
from tests.integration.one_poison import Passing, settle_one_poison

N = 5
POISON = 2
REASON = "returned the coroutine _app.<locals>.save() without awaiting it"


def _app(name: str, interceptor: bool, attempts: int
         ) -> tuple[App, list[int], list[int]]:
    app = App(name, interceptors=[Passing()] if interceptor else [])
    calls: list[int] = []
    saved: list[int] = []

    async def save(seq: int) -> None:
        saved.append(seq)

    @app.handler("items", retry_attempts=attempts)
    async def handle(item: dict[str, int]) -> Any:
        calls.append(item["seq"])
        if item["seq"] == POISON:
            return save(item["seq"])  # the bug: not awaited
        await save(item["seq"])
        return {"ignored": True}  # any other value is ignored, as before

    return app, calls, saved


@pytest.mark.parametrize("interceptor", [False, True], ids=["shipped-chain", "app-interceptor"])
@pytest.mark.parametrize("attempts", [1, 2])
async def test_it_fails_the_call_and_is_dead_lettered(interceptor: bool, attempts: int) -> None:
    app, calls, saved = _app(f"returns-coroutine-{interceptor}-{attempts}", interceptor,
                             attempts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        letter, handled = await settle_one_poison(app, N)
        gc.collect()
    assert letter.body == {"seq": POISON}
    assert letter.letter is not None and letter.letter.attempts == attempts
    assert letter.letter.error_type == "HandlerDeclarationError"
    assert REASON in letter.letter.error
    # Every message was called in order (the poison one once per attempt); only the
    # others' work ran, each once: exactly what was published, nothing lost.
    assert calls == [0, 1, *[POISON] * attempts, 3, 4]
    assert saved == [0, 1, 3, 4] and handled == [0, 1, 3, 4]
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []


async def test_a_batch_handler_returning_one_fails_its_batch() -> None:
    app = App("returns-coroutine-batch")
    saved: list[int] = []

    async def save(seqs: list[int]) -> None:
        saved.extend(seqs)

    @app.handler("items", batch_size=N, batch_wait_ms=50, retry_attempts=1)
    async def handle(items: list[dict[str, int]]) -> Any:
        return save([i["seq"] for i in items])  # the bug: not awaited

    async with TestWorker(app, settle_timeout_s=10.0) as worker:
        for seq in range(N):
            await worker.publish("items", f"k{seq}", {"seq": seq})
        await worker.settle(raise_on_dead_letters=False)
        letters = worker.dead_lettered("items")
        assert sorted(m.body["seq"] for m in letters) == list(range(N))
        assert all(m.letter is not None and "without awaiting it" in m.letter.error
                   for m in letters)
    assert saved == []


@pytest.mark.parametrize("kind", ["def-generator", "async-def-generator",
                                  "async-def-async-generator"])
async def test_a_handler_returning_a_generator_fails_the_call(kind: str) -> None:
    # A generator function wrapped in a plain function (a decorator of its own), whose
    # `yield` the declaration therefore could not see, returned its generator unrun: the
    # message was acknowledged as handled, its work never done.
    app = App(f"returns-generator-{kind}")
    saved: list[int] = []

    def save(seq: int) -> Any:
        saved.append(seq)
        yield

    async def save_async(seq: int) -> Any:
        saved.append(seq)
        yield

    def poisoned(seq: int) -> Any:
        if seq != POISON:
            saved.append(seq)
            return None
        return save_async(seq) if kind.endswith("async-generator") else save(seq)

    if kind.startswith("def"):
        @app.handler("items", retry_attempts=1)
        def handle(item: dict[str, int]) -> Any:
            return poisoned(item["seq"])
    else:
        @app.handler("items", retry_attempts=1)
        async def handle_async(item: dict[str, int]) -> Any:
            return poisoned(item["seq"])

    letter, handled = await settle_one_poison(app, N)
    assert letter.body == {"seq": POISON}
    assert letter.letter is not None and letter.letter.error_type == "HandlerDeclarationError"
    assert "without iterating it, so it never ran" in letter.letter.error, letter.letter.error
    assert saved == [0, 1, 3, 4] and handled == [0, 1, 3, 4]  # the rest each once
