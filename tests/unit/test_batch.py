"""Batch handlers: declaration checks, and the batch step's retry and bisection."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from conveyor import App, HandlerDeclarationError, MessageContext
from conveyor.platform.delivery.batch import batch_step
from conveyor.platform.delivery.chain import DeliveryStats
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message


class Click(msgspec.Struct):
    seq: int


def message(seq: int, body: bytes | None = None) -> Message:
    return Message(f"m{seq}", StreamId("clicks", "k"), body or msgspec.json.encode(Click(seq)))


def test_a_batch_handler_decodes_each_body_with_its_lists_element_type() -> None:
    app = App("t")

    @app.handler("clicks", batch_size=500, batch_wait_ms=50)
    async def h(events: list[Click]) -> None: ...

    [spec] = app.handlers
    assert spec.batch is not None and (spec.batch.size, spec.batch.wait_ms) == (500, 50.0)
    assert spec.decode(message(3)) == Click(3)


@pytest.mark.parametrize(("options", "match"), [
    ({"batch_size": 0}, r"batch_size must be an int in \[1, 100000\], got 0"),
    ({"batch_size": True}, "batch_size must be an int"),
    ({"batch_size": 10, "batch_wait_ms": -1}, "batch_wait_ms must be a number"),
    ({"batch_wait_ms": 5}, r"batch_wait_ms applies to batch handlers only \(batch_size=N\)"),
    ({"batch_size": 10, "stateless": True}, "batch handlers .* cannot use stateless=True"),
    ({"batch_size": 10, "cell_key": "header:t"}, "cannot use cell_key"),
    ({"batch_size": 10, "idempotent": True}, "cannot use idempotent=True"),
])
def test_bad_batch_options_are_refused_at_declaration(options: dict[str, Any],
                                                      match: str) -> None:
    with pytest.raises(HandlerDeclarationError, match=match):
        App("t").handler("clicks", **options)


def test_a_batch_handler_must_take_one_list_parameter() -> None:
    app = App("t")
    with pytest.raises(HandlerDeclarationError, match=r"annotates its parameter list\[T\]"):
        @app.handler("clicks", batch_size=10)
        async def one(event: Click) -> None: ...
    with pytest.raises(HandlerDeclarationError, match="takes one parameter"):
        @app.handler("clicks", batch_size=10)
        async def two(events: list[Click], ctx: MessageContext) -> None: ...


class Run:
    """A batch handler failing on the poison seqs, and what the step stored."""

    def __init__(self, poison: set[int], attempts: int = 1) -> None:
        self.poison = poison
        self.calls: list[list[int]] = []
        self.handled: list[int] = []
        self.letters: list[DeadLetter] = []
        self.stats = DeliveryStats()
        app = App("t")

        @app.handler("clicks", batch_size=1000, retry_attempts=attempts, retry_delay_s=0)
        async def handler(batch: list[Click]) -> None:
            seqs = [c.seq for c in batch]
            self.calls.append(seqs)
            bad = [s for s in seqs if s in self.poison]
            if bad:
                raise ValueError(f"bad {bad}")
            self.handled.extend(seqs)

        async def put(letter: DeadLetter) -> None:
            self.letters.append(letter)

        self.step = batch_step(app.handlers[0], put, self.stats)


@pytest.mark.parametrize("poison", [set(), {0}, {511}, {3, 4}, {0, 100, 255, 256, 511},
                                    set(range(0, 512, 37))])
async def test_bisection_dead_letters_exactly_the_poison_messages(poison: set[int]) -> None:
    run = Run(poison)
    await run.step([message(i) for i in range(512)])
    assert sorted(int(x.message.id[1:]) for x in run.letters) == sorted(poison)
    for letter in run.letters:
        assert letter.error == f"bad [{letter.message.id[1:]}]"  # its own reason
    assert run.handled == [i for i in range(512) if i not in poison]  # once each, in order
    assert run.stats.handled == 512 - len(poison)
    assert run.stats.dead_lettered == 0  # counted by the store, not the step
    # Bisection's cost: at most ~2 calls per poison message per level, plus the first.
    assert len(run.calls) <= 1 + 2 * max(len(poison), 1) * math.ceil(math.log2(512))


async def test_a_single_poison_message_gets_the_whole_retry_policy_on_its_own() -> None:
    run = Run({5}, attempts=3)
    await run.step([message(i) for i in range(8)])
    whole = [c for c in run.calls if len(c) == 8]
    alone = [c for c in run.calls if c == [5]]
    assert len(whole) == 3 and len(alone) == 3  # the batch's 3 attempts, then its own 3
    [letter] = run.letters
    assert letter.message.id == "m5" and letter.attempts == 3
    assert run.handled == [0, 1, 2, 3, 4, 6, 7]


async def test_undecodable_bodies_are_dead_lettered_and_left_out_of_the_call() -> None:
    run = Run(set())
    await run.step([message(0), message(1, b"{]"), message(2)])
    assert run.calls == [[0, 2]]
    [letter] = run.letters
    assert letter.message.id == "m1" and letter.attempts == 0
    assert letter.error_type == "DecodeError"


def test_bench_batch_is_refused_on_kafka_as_a_usage_error() -> None:
    from click.testing import CliRunner

    from conveyor.cli import main

    result = CliRunner().invoke(main, ["bench", "throughput", "--adapter", "kafka",
                                       "--batch", "500"])
    assert result.exit_code == 2
    assert "--batch" in result.output and "not kafka" in result.output



async def test_messages_over_max_deliveries_are_dead_lettered_before_the_batch_runs() -> None:
    """A batch that killed its worker every time comes back with its deliveries counted:
    past ``max_deliveries`` (5 by default) those messages are DeliveryLimit letters with
    no call made, and the others of the batch are handled."""
    run = Run(set())
    batch = [msgspec.structs.replace(message(i), deliveries=6 if i in (1, 2) else 5)
             for i in range(4)]
    await run.step(batch)
    assert sorted(x.message.id for x in run.letters) == ["m1", "m2"]
    assert {x.error_type for x in run.letters} == {"DeliveryLimit"}
    assert all(x.attempts == 0 and "max_deliveries = 5" in x.error for x in run.letters)
    assert run.handled == [0, 3]
