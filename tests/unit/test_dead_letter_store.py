"""The dead-letter store: an outage is waited out, a letter it cannot take is shortened."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from conveyor.platform.backoff import Backoff
from conveyor.platform.delivery import DeadLetterStore, DeliveryStats
from conveyor.platform.errors import BrokerConnectionError, BrokerError, StoreUnfitError
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import DeadLetter, Message
from tests.conftest import wait_until

FAST = Backoff(first_s=0.001, multiplier=2.0, cap_s=0.01)


def letter(body: bytes = b'{"n": 1}') -> DeadLetter:
    msg = Message("m1", StreamId("orders", "k"), body, {"x-tenant": "t"},
                  token=SequenceToken(2, 40))
    return DeadLetter.of(msg, "orders.handle", ValueError("poison"), 3)


class Store:
    """Takes letters until told otherwise: ``down`` raises an outage, ``refuse`` the forms
    it will not take (as a broker refuses a record over its size limit)."""

    def __init__(self) -> None:
        self.kept: list[DeadLetter] = []
        self.down = False
        self.refuse: set[str] = set()
        self.calls = 0

    async def __call__(self, letters: Sequence[DeadLetter]) -> int:
        self.calls += 1
        if self.down:
            raise BrokerConnectionError("connection refused")
        for one in letters:
            if one.form in self.refuse:
                raise BrokerError(f"MessageSizeTooLargeError: {one.form} too large")
        self.kept.extend(letters)
        return 0


async def test_an_outage_is_waited_out_and_shown_while_it_lasts() -> None:
    store, stats = Store(), DeliveryStats()
    dead = DeadLetterStore(store, stats, backoff=FAST)
    store.down = True
    put = asyncio.create_task(dead.put(letter()))
    await wait_until(lambda: store.calls >= 3, 5, what="retries while down")
    assert not put.done() and dead.waiting == 1 and dead.down_since is not None
    assert stats.dead_lettered == 0
    store.down = False
    await asyncio.wait_for(put, 5)
    assert [ltr.form for ltr in store.kept] == ["full"]
    assert dead.waiting == 0 and dead.down_since is None and stats.dead_lettered == 1


async def test_a_letter_the_store_cannot_take_is_stored_shorter_not_retried_for_ever() -> None:
    store, stats = Store(), DeliveryStats()
    dead = DeadLetterStore(store, stats, backoff=FAST)
    store.refuse = {"full"}
    await asyncio.wait_for(dead.put(letter()), 5)
    [kept] = store.kept
    assert kept.form == "minimal" and kept.message.body == b'{"n": 1}'
    assert kept.message.headers == {} and kept.message.token == SequenceToken(2, 40)
    assert "poison" in kept.error and "MessageSizeTooLargeError" in kept.error
    store.refuse = {"full", "minimal"}
    await asyncio.wait_for(dead.put(letter(b"x" * 100)), 5)
    bare = store.kept[-1]
    assert bare.form == "bare" and bare.message.body == b"" and "100 bytes" in bare.error
    assert stats.dead_lettered == 2 and store.calls == 5


async def test_a_store_refusing_even_a_bare_letter_holds_the_message_until_it_takes_it(
) -> None:
    store, stats = Store(), DeliveryStats()
    dead = DeadLetterStore(store, stats, backoff=FAST)
    store.refuse = {"full", "minimal", "bare"}
    put = asyncio.create_task(dead.put(letter()))
    await wait_until(lambda: store.calls >= 6, 5, what="retries of the bare form")
    assert not put.done() and dead.down_since is not None
    store.refuse = set()
    await asyncio.wait_for(put, 5)
    assert [ltr.form for ltr in store.kept] == ["bare"] and stats.dead_lettered == 1


async def test_the_log_line_of_a_letter_stays_one_line_whatever_its_error_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An error text with line breaks was logged as is: a multi-line warning, whose
    # later lines could pass for log lines of their own. The letter keeps it as raised.
    store, stats = Store(), DeliveryStats()
    forged = "bad input\n2026-11-27 08:00:00,000 ERROR conveyor.daemon: forged\r"
    msg = Message("m1", StreamId("orders", "k"), b"{}", token=SequenceToken(2, 40))
    with caplog.at_level(logging.WARNING, logger="conveyor"):
        await DeadLetterStore(store, stats, backoff=FAST).put(
            DeadLetter.of(msg, "orders.handle", ValueError(forged), 3))
    [record] = [r for r in caplog.records if "dead-lettering" in r.getMessage()]
    line = record.getMessage()
    assert "\n" not in line and "\r" not in line
    assert line.endswith("ValueError: bad input\\n2026-11-27 08:00:00,000 ERROR "
                         "conveyor.daemon: forged\\r")
    assert [kept.error for kept in store.kept] == [forged]


async def test_a_store_unfit_for_letters_is_said_once_and_the_letter_kept_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A Redis key of another type where the letters go: the letter was shortened to its
    # bare form (the store's fault, not the letter's) and each retry logged as an outage
    # of "the dead-letter store at the broker unreachable".
    unfit = "redis key t:dlq:a (app 'a''s dead letters) is a string, not a stream: fix it"

    class Unfit(Store):
        async def __call__(self, letters: Sequence[DeadLetter]) -> int:
            if self.down:
                self.calls += 1
                raise StoreUnfitError(unfit)
            return await super().__call__(letters)

    store, stats = Unfit(), DeliveryStats()
    dead = DeadLetterStore(store, stats, backoff=FAST)
    store.down = True
    with caplog.at_level(logging.INFO, logger="conveyor.dead_letters"):
        puts = [asyncio.create_task(dead.put(letter())) for _ in range(2)]
        await wait_until(lambda: store.calls >= 8, 5, what="retries while unfit")
        assert dead.waiting == 2 and dead.down_since is not None
        store.down = False
        await asyncio.wait_for(asyncio.gather(*puts), 5)
    assert [ltr.form for ltr in store.kept] == ["full", "full"]
    assert dead.waiting == 0 and dead.down_since is None and stats.dead_lettered == 2
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if not r.getMessage().startswith("dead-lettering message")]
    assert said[0] == ("ERROR", f"cannot store dead letters: {unfit} (retried with back-off: "
                                "stored once it is fixed)")
    assert [(level, text.split(" after ")[0]) for level, text in said[1:]] == [
        ("WARNING", "dead letters stored again")]


@pytest.mark.parametrize(("attempts", "at", "read"), [
    (b"3", b"1700000000000", (3, 1700000000000)),
    # Digits of other scripts in a letter another writer stored: a superscript two
    # passed str.isdigit and failed int() (a ValueError out of `dlq list`); now they
    # read as a number that is not there, as any other text does.
    ("\u00b2".encode(), "\u0663".encode(), (0, 0)),
    (b"x", b"", (0, 0)),
])
def test_a_letters_counts_are_read_back_only_from_ascii_digits(
    attempts: bytes, at: bytes, read: tuple[int, int]
) -> None:
    from conveyor.platform.letters import letter_from_meta

    message = Message("m1", StreamId("ns", "k"), b"{}")
    values = [b"1", b"app", b"h", b"ValueError", b"boom", attempts, at, b"", b"full"]
    letter = letter_from_meta(values, message)
    assert (letter.attempts, letter.failed_at_ms) == read
